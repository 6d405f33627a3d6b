"""Validate rendered objects against the real schemas: the CRD's openAPIV3Schema for custom
resources (PyTorchJob from Training Operator v1.9.4), the Kubernetes OpenAPI (kubernetes-validate)
for built-ins.

CRD schemas are given as parsed YAML, so this module reads nothing itself. Validation is strict,
like `kubectl apply --validate=strict`: a field the schema does not declare is an error, not
silently pruned.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable
from typing import Any

KUBERNETES_VERSION = "1.33.0"  # EKS standard support in 2026

Obj = dict[str, Any]  # a parsed manifest or JSON schema


class SchemaError(Exception):
    pass


def strict(schema: Obj) -> Obj:
    """Forbid undeclared fields wherever the schema lists its properties (as the API server's strict
    mode)."""
    schema = copy.deepcopy(schema)
    _forbid_undeclared(schema)
    return schema


def _forbid_undeclared(node: object) -> None:
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            _forbid_undeclared(value)
    elif isinstance(node, list):
        for value in node:
            _forbid_undeclared(value)


def crd_schemas(crds: Iterable[Obj]) -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> strict JSON schema, from CustomResourceDefinition objects."""
    out: dict[tuple[str, str], Obj] = {}
    for crd in crds:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = strict(version["schema"]["openAPIV3Schema"])
    return out


def _custom_errors(obj: Obj, schema: Obj) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    errors = []
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in err.absolute_path) or "<root>"
        errors.append(f"{path}: {err.message}")
    return errors


def _builtin_errors(obj: Obj) -> list[str]:
    try:
        import kubernetes_validate
    except ImportError as e:
        raise SchemaError(
            "kubernetes-validate is not installed: pip install 'fsdpctl[validate]'"
        ) from e
    _cache_schemas()
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(str(p) for p in e.path) or '<root>'}: {e.message}"]
    return []


@functools.cache
def _cache_schemas() -> None:
    """kubernetes-validate opens and parses its schema and its ~1 MB _definitions.json again for
    every object (`utils.schema_contents`, called by `utils.validate`): about half of a job's
    validation. Parsed once per process instead; the parsed schemas are only read
    (`referencing.Resource.from_contents`)."""
    from kubernetes_validate import utils

    utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)


def _is_custom(api_version: str) -> bool:
    """Built-in groups have no dot (apps, batch) or end in .k8s.io (networking.k8s.io, rbac...)."""
    group = api_version.split("/")[0] if "/" in api_version else ""
    return "." in group and not group.endswith(".k8s.io")


def validate(objs: Iterable[Obj], schemas: dict[tuple[str, str], Obj]) -> list[str]:
    """Every problem as 'Kind/name: path: message'; empty when all objects are valid."""
    problems = []
    for obj in objs:
        key = (obj.get("apiVersion", ""), obj.get("kind", ""))
        where = f"{key[1]}/{obj.get('metadata', {}).get('name', '?')}"
        if _is_custom(key[0]):
            if key not in schemas:
                problems.append(f"{where}: no CRD schema for {key[0]} {key[1]}")
                continue
            errs = _custom_errors(obj, schemas[key])
        else:
            errs = _builtin_errors(obj)
        problems += [f"{where}: {e}" for e in errs]
    return problems


# Kubernetes names and labels, as apimachinery checks them (k8s.io/apimachinery/pkg/util/validation/
# validation.go: IsQualifiedName, IsValidLabelValue, IsDNS1123Subdomain): a label key is an optional
# DNS subdomain prefix and `/`, then a name of at most 63 characters; a value at most 63, possibly
# empty.
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
LABEL_MAX = 63
SUBDOMAIN_MAX = 253


def label_value(text: str) -> str:
    """At most 63 characters that still end in a letter or digit, as a label value (and a DNS label)
    must (apimachinery pkg/util/validation IsValidLabelValue): a bare [:63] of a 64-128 character
    run id could end in '-', '_' or '.', and the API server would refuse the whole object."""
    return text[:LABEL_MAX].rstrip("-_.")


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is no valid label (or taint) key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "its prefix before '/' is empty"
    if prefix and (len(prefix) > SUBDOMAIN_MAX or not _DNS_1123_SUBDOMAIN.match(prefix)):
        return f"its prefix {prefix!r} is not a DNS subdomain (lower case, digits, '-', '.'; at most 253)"
    if len(name) > LABEL_MAX:
        return f"its name part has {len(name)} characters, over {LABEL_MAX}"
    if not _LABEL_NAME.match(name):
        return "its name part must start and end with a letter or digit (between them also - _ .)"
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is no valid label (or taint) value, or None."""
    if len(value) > LABEL_MAX:
        return f"it has {len(value)} characters, over {LABEL_MAX}"
    if value and not _LABEL_NAME.match(value):
        return "it must start and end with a letter or digit (between them also - _ .)"
    return None
