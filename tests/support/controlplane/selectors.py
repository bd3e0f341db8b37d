"""Label and field selectors, as the API server reads them, for the stand-ins' cached lists
(standins.View.list)."""

from __future__ import annotations

import re

from .client import ApiError

# One requirement is (key, operator, values); operators as in metav1.LabelSelectorRequirement.
_TERM = re.compile(
    r"""^\s*(?:
        !\s*(?P<absent>[^\s,!=()]+)
      | (?P<setkey>[^\s,!=()]+)\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)
      | (?P<key>[^\s,!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s,!=()]*)
      | (?P<exists>[^\s,!=()]+)
    )\s*$""",
    re.X,
)


def _split_terms(text: str):
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t for t in terms if t.strip()]


def parse_label_selector(text: str) -> list:
    """Parse the query-string form (`a=b,c!=d,e in (x,y),!f,g`)."""
    reqs = []
    for term in _split_terms(text or ""):
        m = _TERM.match(term)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term.strip()!r}")
        if m["absent"]:
            reqs.append((m["absent"], "DoesNotExist", []))
        elif m["setkey"]:
            values = [v.strip() for v in m["values"].split(",") if v.strip()]
            reqs.append((m["setkey"], "In" if m["setop"] == "in" else "NotIn", values))
        elif m["key"]:
            reqs.append((m["key"], "NotIn" if m["op"] == "!=" else "In", [m["value"]]))
        else:
            reqs.append((m["exists"], "Exists", []))
    return reqs


def labels_match(reqs, labels) -> bool:
    if reqs is None:
        return False
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def parse_field_selector(text: str) -> list:
    reqs = []
    for term in _split_terms(text or ""):
        m = re.match(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term.strip()!r}")
        reqs.append((m[1], m[2] != "!=", m[3]))
    return reqs


def field_value(obj: dict, path: str) -> str:
    value = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def fields_match(reqs, obj) -> bool:
    return all((field_value(obj, path) == value) == equal for path, equal, value in reqs)
