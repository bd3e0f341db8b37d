"""The NVIDIA stand-ins the test cluster runs as controllers (tests/support/controlplane/standins.py):
the device plugin and GFD (deviceplugin.py, sharing.py), the kubelet's device manager
(allocations.py), the GPU Operator (operator.py, gpucluster.py), mig-manager (migmanager.py),
NVIDIA's DRA kubelet plugin (dra.py, dynamic.py) and HAMi (hami.py); and the manifests tests seed
(seed.py, kueue.py). What each follows upstream and leaves out: docs/testing-kubernetes.md.
"""
