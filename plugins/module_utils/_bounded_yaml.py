# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Config text read with limits that hostile YAML cannot get past.

Private to the collection; no Ansible imports. PyYAML's loaders build the whole
document before anything can look at it: a "billion laughs" of aliases expands
into values whose text fills memory, and deep nesting ends in RecursionError, or
in libyaml's C composer, a crash of the process with no result at all. So the
document is built here from the parser's event stream, in one loop without
recursion, and each limit is checked on the event, before the value it would
make exists:

- the text is at most MAX_CHARS characters (a Kubernetes ConfigMap holds 1 MiB);
- collections nest at most MAX_DEPTH deep (a mig-parted config needs 5, an inline layout 8);
- aliases (and merge keys, which copy) add at most MAX_ALIAS_NODES values in all;
- a scalar is at most MAX_SCALAR_CHARS characters.

What it builds is what PyYAML's SafeLoader builds (YAML 1.1 scalars, merge keys),
except that a key given twice is refused with the key and its line, an alias
inside the node it names is refused, and the tags !!set, !!omap and !!pairs
(which mig-parted cannot read either) are refused.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpuops.mig.plugins.module_utils._errors import ParseError, excerpt

MAX_CHARS = 1024 * 1024
MAX_DEPTH = 32
MAX_ALIAS_NODES = 10000
MAX_SCALAR_CHARS = 4096

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_COLLECTION_TAGS = {"mapping": (None, "!", "tag:yaml.org,2002:map"), "sequence": (None, "!", "tag:yaml.org,2002:seq")}
_NOT_SCALAR_TAGS = ("tag:yaml.org,2002:seq", "tag:yaml.org,2002:map", "tag:yaml.org,2002:set",
                    "tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs")
_NO_KEY = object()


def load(text: str, origin: str) -> Any:
    """The one YAML document of ``text`` as Python data (None for an empty stream).

    Raises ParseError (a ConfigError) naming ``origin`` and the line for text that is
    not valid YAML or goes past a limit; nothing else for any text.
    """
    if len(text) > MAX_CHARS:
        raise ParseError("%s: %d characters of text, more than the %d a config may have"
                         % (origin, len(text), MAX_CHARS))
    try:
        import yaml
    except ImportError:  # pragma: no cover - exercised only where PyYAML is missing
        raise ParseError("%s: reading YAML needs the PyYAML Python package on this host "
                         "(or pass the config as a mapping)" % origin)
    builder = _Builder(yaml, origin)
    try:
        # libyaml's parser where PyYAML has it (every node read of a rollout parses the config it is
        # given); both parsers make events without recursion.
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            builder.add(event)
    except yaml.YAMLError as err:
        # The parser's own words, on one line; they quote at most a line of the text.
        raise ParseError("%s: not valid YAML: %s" % (origin, excerpt(" ".join(str(err).split()), 300, quote=False)))
    except UnicodeError as err:     # libyaml reads UTF-8: a lone surrogate (JSON's "\ud800") cannot be one
        raise ParseError("%s: not valid text: %s" % (origin, excerpt(str(err), 300, quote=False)))
    return builder.document


class _Frame(object):
    """A collection being built: its value so far, and what the limits need to know of it."""

    __slots__ = ("kind", "value", "anchor", "line", "size", "key", "key_line", "merges")

    def __init__(self, kind, anchor, line):
        self.kind = kind
        self.value = {} if kind == "mapping" else []
        self.anchor = anchor
        self.line = line
        self.size = 1
        self.key = _NO_KEY
        self.key_line = line
        self.merges = []


class _Builder(object):

    def __init__(self, yaml, origin):
        self.yaml = yaml
        self.origin = origin
        self.stack = []
        self.anchors = {}         # name -> (value, size); None while the node it names is being built
        self.alias_nodes = 0
        self.documents = 0
        self.document = None
        self.scalars = {}         # (tag, text) -> value; scalars are immutable, and configs repeat them
        self.constructor = None

    def fail(self, line, message):
        raise ParseError("%s: not valid YAML: line %d: %s" % (self.origin, line + 1, message))

    def over_limit(self, line, message):
        raise ParseError("%s: line %d: %s" % (self.origin, line + 1, message))

    def add(self, event):
        kind = type(event).__name__
        line = event.start_mark.line
        if kind == "ScalarEvent":
            self.scalar(event, line)
        elif kind in ("MappingStartEvent", "SequenceStartEvent"):
            self.start(event, "mapping" if kind == "MappingStartEvent" else "sequence", line)
        elif kind in ("MappingEndEvent", "SequenceEndEvent"):
            self.end()
        elif kind == "AliasEvent":
            self.alias(event.anchor, line)
        elif kind == "DocumentStartEvent":
            self.documents += 1
            if self.documents > 1:
                self.fail(line, "a second YAML document; a config is one document")
            self.anchors = {}

    def start(self, event, kind, line):
        if len(self.stack) >= MAX_DEPTH:
            self.over_limit(line, "collections nested more than %d deep; a mig-parted config needs fewer than 10"
                            % MAX_DEPTH)
        if event.tag not in _COLLECTION_TAGS[kind]:
            self.fail(line, "the tag %s is not allowed on a %s here" % (excerpt(event.tag), kind))
        if event.anchor is not None:
            self.anchors[event.anchor] = None
        self.stack.append(_Frame(kind, event.anchor, line))

    def end(self):
        frame = self.stack.pop()
        value = frame.value
        if frame.kind == "mapping":
            if frame.key is not _NO_KEY:    # the parser never ends a mapping after a key; kept for safety
                self.fail(frame.key_line, "a key without a value")
            if frame.merges:
                value = self.merged(frame)
        if frame.anchor is not None:
            self.anchors[frame.anchor] = (value, frame.size)
        self.put(value, frame.size, frame.line)

    def scalar(self, event, line):
        text = event.value
        if len(text) > MAX_SCALAR_CHARS:
            self.over_limit(line, "a value of %d characters, more than the %d allowed: %s"
                            % (len(text), MAX_SCALAR_CHARS, excerpt(text)))
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(text) if event.implicit[0] else _STR
        if tag == _MERGE and self.stack and self.stack[-1].kind == "mapping" and self.stack[-1].key is _NO_KEY:
            value = _MERGE_KEY
        elif tag == _STR:
            value = text
        else:
            value = self.construct(tag, text, event, line)
        if event.anchor is not None:
            self.anchors[event.anchor] = (value, 1)
        self.put(value, 1, line)

    def alias(self, name, line):
        if name not in self.anchors:
            self.fail(line, "the alias %s names no anchor before it" % _alias_text(name))
        anchored = self.anchors[name]
        if anchored is None:
            self.fail(line, "the alias %s is inside the node it names" % _alias_text(name))
        value, size = anchored
        self.alias_nodes += size
        if self.alias_nodes > MAX_ALIAS_NODES:
            self.over_limit(line, "aliases that expand to more than %d values (at %s); a mig-parted config has no "
                            "use for that" % (MAX_ALIAS_NODES, _alias_text(name)))
        self.put(value, size, line)

    def put(self, value, size, line):
        if not self.stack:
            self.document = value
            return
        frame = self.stack[-1]
        frame.size += size
        if frame.kind == "sequence":
            frame.value.append(value)
        elif frame.key is _NO_KEY:
            try:
                duplicate = value in frame.value
            except TypeError:
                self.fail(line, "a key that is a %s; keys must be scalars" % _kind(value))
            if duplicate:
                self.fail(line, "found duplicate key %s" % excerpt(value))
            frame.key, frame.key_line = value, line
        else:
            if frame.key is _MERGE_KEY:
                frame.merges.append((value, frame.key_line))
            else:
                frame.value[frame.key] = value
            frame.key = _NO_KEY

    def merged(self, frame):
        """The mapping with its << keys applied as SafeLoader applies them: the merged keys first (of a list
        of mappings, the last one's first), then the mapping's own; a key found twice is refused."""
        value = {}
        for merge, line in frame.merges:
            sources = merge if isinstance(merge, list) else [merge]
            if not all(isinstance(source, dict) for source in sources):
                self.fail(line, "<< needs a mapping or a list of mappings to merge")
            for source in reversed(sources):
                for key, item in source.items():
                    if key in value:
                        self.fail(line, "found duplicate key %s (from <<)" % excerpt(key))
                    value[key] = item
        for key, item in frame.value.items():
            if key in value:
                self.fail(frame.line, "found duplicate key %s (also from <<)" % excerpt(key))
            value[key] = item
        return value

    def resolve(self, text):
        resolvers = self.yaml.resolver.Resolver.yaml_implicit_resolvers
        for tag, regexp in resolvers.get(text[0] if text else "", []):
            if regexp.match(text):
                return tag
        return _STR

    def construct(self, tag, text, event, line):
        key = (tag, text)
        if key in self.scalars:
            return self.scalars[key]
        yaml = self.yaml
        constructor = yaml.constructor.SafeConstructor.yaml_constructors.get(tag)
        if constructor is None or tag in _NOT_SCALAR_TAGS:
            self.fail(line, "could not determine a constructor for the tag %s" % excerpt(tag))
        if self.constructor is None:
            self.constructor = yaml.constructor.SafeConstructor()
        mark = event.start_mark if event is not None else None
        try:
            value = constructor(self.constructor, yaml.nodes.ScalarNode(tag, text, mark, mark))
        except Exception as err:  # a tag's reader raises ValueError and others for text it cannot read
            self.fail(line, "%s cannot be read as %s: %s" % (excerpt(text), tag, excerpt(str(err), 120)))
        self.scalars[key] = value
        return value


class _MergeKey(object):
    """Marks a << key while its mapping is being built (never part of what load returns)."""

    def __repr__(self):
        return "<<"


_MERGE_KEY = _MergeKey()


def _kind(value):
    return "mapping" if isinstance(value, dict) else "list" if isinstance(value, list) else type(value).__name__


def _alias_text(name):
    # Anchor names are letters, digits, - and _ (the parsers allow nothing else), but not short.
    return "*" + (name if len(name) <= 40 else name[:40] + "...")
