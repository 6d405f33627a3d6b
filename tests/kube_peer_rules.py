"""The rules the Kubernetes test peer (kube_peer.py) applies, pure and each after its upstream
source: label and field selectors, JSON merge patch, object names, and field validation against a
schema (the Kubernetes OpenAPI of the built-in kinds as kubernetes-validate ships it, or a CRD's
structural schema)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

# --- label selectors ----------------------------------------------------------------------------------------

NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{NAME}$"
)
LABEL_VALUE = re.compile(rf"^({NAME})?$")
KEY = r"(?P<key>[^\s=!<>(),]+)"
REQUIREMENT = [
    ("!", re.compile(rf"^!\s*{KEY}$")),
    ("exists", re.compile(rf"^{KEY}$")),
    ("set", re.compile(rf"^{KEY}\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")),
    ("cmp", re.compile(rf"^{KEY}\s*(?P<op>==|=|!=|<|>)\s*(?P<value>[^\s=!<>(),]*)$")),
]


class SelectorError(ValueError):
    """The API server answers 400 BadRequest with this message."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # exists, !, =, !=, in, notin, <, >
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        """As labels.Requirement.Matches in k8s.io/apimachinery/pkg/labels/selector.go: != and notin
        also match objects without the key; < and > compare integers and need the key."""
        have = labels.get(self.key)
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op in ("=", "in"):
            return have in self.values
        if self.op in ("!=", "notin"):
            return have not in self.values
        if have is None or not re.fullmatch(r"-?\d+", have):
            return False
        return (
            int(have) < int(self.values[0]) if self.op == "<" else int(have) > int(self.values[0])
        )


def parse_labels(text: str) -> list[Requirement]:
    """A label selector, equality-based (a=b, a==b, a!=b) and set-based (a in (x,y), a notin (x), a,
    !a, and a<N / a>N), comma meaning AND; grammar and checks of labels.Parse (apimachinery
    pkg/labels/selector.go)."""
    return [_requirement(part.strip()) for part in _split(text) if part.strip()]


def _split(text: str) -> list[str]:
    """Commas separate requirements, except inside the parentheses of a set."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _requirement(text: str) -> Requirement:
    for kind, pattern in REQUIREMENT:
        if m := pattern.match(text):
            key = m.group("key")
            if not LABEL_KEY.match(key) or len(key.split("/")[-1]) > 63:
                raise SelectorError(
                    f'unable to parse requirement: key: Invalid value: "{key}": name part must consist '
                    "of alphanumeric characters, '-', '_' or '.'"
                )
            if kind in ("!", "exists"):
                return Requirement(key, kind)
            op = m.group("op").replace("==", "=")
            values = (
                tuple(v.strip() for v in m.group("values").split(","))
                if kind == "set"
                else (m.group("value"),)
            )
            return Requirement(key, op, _checked(key, op, values))
    raise SelectorError(
        f'unable to parse requirement: couldn\'t parse the selector string "{text}"'
    )


def _checked(key: str, op: str, values: tuple[str, ...]) -> tuple[str, ...]:
    for i, v in enumerate(values):
        if op in ("<", ">") and not re.fullmatch(r"-?\d+", v):
            raise SelectorError(
                f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {v}"
            )
        if not LABEL_VALUE.match(v) or len(v) > 63:
            raise SelectorError(
                f'unable to parse requirement: values[{i}][{key}]: Invalid value: "{v}": a valid label '
                "must be an "
                "empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and "
                "end with "
                "an alphanumeric character"
            )
    return values


def selects(requirements: list[Requirement], labels: dict[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in requirements)


# --- field selectors ----------------------------------------------------------------------------------------

# The fields each kind lets you select on, besides metadata.name and metadata.namespace (which every
# kind has: apiserver pkg/registry/generic DefaultClusterScopedAttr/DefaultNamespaceScopedAttr).
# From the kinds' registries in kubernetes/kubernetes pkg/registry: core/pod/strategy.go
# (ToSelectableFields), core/event/strategy.go, core/secret/strategy.go, core/namespace/strategy.go,
# core/node/strategy.go.
SELECTABLE = {
    ("", "pods"): (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    ("", "events"): (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    ("", "secrets"): ("type",),
    ("", "namespaces"): ("status.phase",),
    ("", "nodes"): ("spec.unschedulable",),
}


def parse_fields(text: str, group: str, plural: str) -> list[tuple[str, str, str]]:
    """(field, op, value) for a field selector: only =, == and != (apimachinery
    pkg/fields/selector.go), only on fields the kind declares selectable; another field is a 400 as
    the server says it."""
    allowed = ("metadata.name", "metadata.namespace", *SELECTABLE.get((group, plural), ()))
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        name, op, value = m.group(1), m.group(2).replace("==", "="), m.group(3)
        if name not in allowed:
            raise SelectorError(
                f"field label not supported: {name}"
                if not _custom(group)
                else f'"{name}" is not a known field selector: only "metadata.name", "metadata.namespace"'
            )
        out.append((name, op, value))
    return out


def fields_match(selector: list[tuple[str, str, str]], obj: dict) -> bool:
    def value(path: str) -> str:
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, bool):
            return str(node).lower()
        return "" if node is None else str(node)

    return all((value(f) == v) == (op == "=") for f, op, v in selector)


def _custom(group: str) -> bool:
    return "." in group and not group.endswith(".k8s.io")


# --- patches and names --------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch (application/merge-patch+json): objects merge key by key, null
    removes a key, anything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def name_errors(plural: str, group: str, name: str) -> list[str]:
    """metadata.name as the kind's validation wants it (apimachinery pkg/api/validation
    ValidateObjectMeta with the kind's name function): a DNS-1123 label for Namespaces, a DNS-1035
    label for Services, a DNS-1123 subdomain otherwise."""
    if group == "" and plural == "namespaces":
        rule, limit, what = DNS1123_LABEL, 63, "a lowercase RFC 1123 label"
    elif group == "" and plural == "services":
        rule, limit, what = DNS1035_LABEL, 63, "a DNS-1035 label"
    else:
        rule, limit, what = DNS1123_SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain"
    if rule.match(name) and len(name) <= limit:
        return []
    return [
        f'metadata.name: Invalid value: "{name}": {what} must consist of lower case alphanumeric characters, '
        f"'-' (and '.' for a subdomain), start and end with an alphanumeric character, at most {limit} long"
    ]


# --- field validation against a schema ----------------------------------------------------------------------

DROP = object()  # a value pruned away
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
}


@dataclass
class Checked:
    """What walking an object along its schema found: the object as stored (unknown fields dropped,
    nulls of non-nullable custom fields pruned), the unknown fields' paths, and value errors (path,
    message)."""

    value: Any
    unknown: list[str] = field(default_factory=list)
    invalid: list[tuple[str, str]] = field(default_factory=list)


class Schema:
    """One kind's schema: a CRD version's openAPIV3Schema (`custom`), or a kubernetes-validate JSON
    schema with its `_definitions.json` for the built-ins. Unknown fields are those an object schema
    does not list in `properties`, unless it has `additionalProperties` or
    `x-kubernetes-preserve-unknown-fields` (structural schema pruning: apiextensions-apiserver
    pkg/apiserver/schema/pruning/algorithm.go; built-ins: the fields of the Go types, which the
    OpenAPI lists)."""

    def __init__(self, root: dict, defs: dict | None = None, custom: bool = False):
        self.root, self.defs, self.custom = root, defs or {}, custom

    def check(self, obj: dict) -> Checked:
        walk = _Walk(self)
        value = walk.node(obj, self.root, "", top=True)
        return Checked(value, walk.unknown, walk.invalid)


class _Walk:
    def __init__(self, schema: Schema):
        self.s = schema
        self.unknown: list[str] = []
        self.invalid: list[tuple[str, str]] = []

    def deref(self, node: dict) -> dict:
        while "$ref" in node:
            node = {
                **self.s.defs[node["$ref"].rsplit("/", 1)[-1]],
                **{k: v for k, v in node.items() if k != "$ref"},
            }
        return node

    def node(self, value: Any, schema: dict, path: str, top: bool = False) -> Any:
        schema = self.deref(schema)
        types = _types(schema, self)
        if value is None:
            return (
                None if ("null" in types or schema.get("nullable") or not self.s.custom) else DROP
            )
        if types and not _type_ok(value, types):
            self.invalid.append((path, _type_message(value, types, path, self.s.custom)))
            return value
        if isinstance(value, dict):
            return self.object(value, schema, path, top)
        if isinstance(value, list) and "items" in schema:
            items = [self.node(v, schema["items"], f"{path}[{i}]") for i, v in enumerate(value)]
            return [v for v in items if v is not DROP]
        self.values(value, schema, path)
        return value

    def object(self, value: dict, schema: dict, path: str, top: bool) -> dict:
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
        meta = (
            ("apiVersion", "kind", "metadata")
            if top or schema.get("x-kubernetes-embedded-resource")
            else ()
        )
        if props is None and not isinstance(extra, dict):
            return value  # free-form (JSON, RawExtension, a bare `type: object`)
        out = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if props and key in props:
                item = self.node(item, props[key], sub)
            elif isinstance(extra, dict):
                item = self.node(item, extra, sub)
            elif not (keep or key in meta):
                self.unknown.append(sub)
                continue
            if item is not DROP:
                out[key] = item
        # a built-in decodes into its Go type, where a missing field is a zero value: only the Go
        # validation code (not reproduced here) refuses one; a custom resource's schema enforces
        # `required` itself
        for key in schema.get("required") or [] if self.s.custom else []:
            if key not in out:
                self.invalid.append((f"{path}.{key}" if path else key, "Required value"))
        return out

    def values(self, value: Any, schema: dict, path: str) -> None:
        """The value checks a structural schema may carry (kube-openapi pkg/validation/validate)."""
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(f'"{v}"' for v in schema["enum"])
            self.invalid.append(
                (path, f'Unsupported value: "{value}": supported values: {allowed}')
            )
        if (
            isinstance(value, str)
            and "pattern" in schema
            and not re.search(schema["pattern"], value)
        ):
            self.invalid.append(
                (
                    path,
                    f"Invalid value: \"{value}\": {path} in body should match '{schema['pattern']}'",
                )
            )
        if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
            self.invalid.append(
                (path, f"Too long: may not be more than {schema['maxLength']} bytes")
            )
        if isinstance(value, int | float) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                self.invalid.append(
                    (
                        path,
                        f"Invalid value: {value}: {path} in body should be greater than or equal to "
                        f"{schema['minimum']}",
                    )
                )
            if "maximum" in schema and value > schema["maximum"]:
                self.invalid.append(
                    (
                        path,
                        f"Invalid value: {value}: {path} in body should be less than or equal to "
                        f"{schema['maximum']}",
                    )
                )


def _types(schema: dict, walk: _Walk) -> set[str]:
    if schema.get("x-kubernetes-int-or-string"):
        return {"integer", "string"}
    kinds = schema.get("type")
    found = set(kinds if isinstance(kinds, list) else [kinds] if kinds else [])
    for option in schema.get("oneOf") or schema.get("anyOf") or []:
        found |= _types(walk.deref(option), walk)
    return found


def _type_ok(value: Any, types: set[str]) -> bool:
    for t in types:
        if (
            t == "integer"
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and float(value).is_integer()
        ):
            return True
        if t == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return True
        if t in TYPES and isinstance(value, TYPES[t]):
            return True
    return False


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number"
    )


def _type_message(value: Any, types: set[str], path: str, custom: bool) -> str:
    want = " or ".join(sorted(types - {"null"}))
    if custom:  # the OpenAPI validator's words (kube-openapi pkg/validation/errors)
        return f'Invalid value: "{_json_type(value)}": {path} in body must be of type {want}: "{value}"'
    # a built-in fails earlier, in the JSON decoder of its Go type
    return f"json: cannot unmarshal {_json_type(value)} into Go struct field .{path} of type {want}"
