"""Load policy files: find them, validate every document, cross-check, compile, lint.

`check_policies` is what `owngate policy check` runs and returns errors and warnings;
`load_policies` is what the gateway runs and raises `PolicyError` on any error. Both
share every step, so a set that checks clean is the set the gateway enforces.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from gateway.policy.compiler import compile_set
from gateway.policy.engine import PolicySet
from gateway.policy.lint import lint
from gateway.policy.schema import API_VERSION, PolicyDocument, PolicySetDocument
from gateway.policy.source import Document, discover, read_documents, validate
from gateway.policy.types import BackendFacts, PolicyError, PolicyIssue
from gateway.small_files import read_small_file

__all__ = ["MAX_POLICY_FILE", "check_policies", "check_sources", "load_policies", "parse_policies"]

# A policy file is a few kilobytes; it is read whole and parsed on the gateway's event
# loop at every reload. A larger one (a path pointing at a log, a disk image) would hold
# the loop for minutes and fill memory: refused, and the last good set stays active.
MAX_POLICY_FILE = 1024 * 1024

Doc = TypeVar("Doc", bound=BaseModel)
CheckResult = tuple[PolicySet | None, list[PolicyIssue], list[PolicyIssue]]


def load_policies(paths: Sequence[Path | str], backends: Sequence[BackendFacts]) -> PolicySet:
    """Load policy files and directories; raises `PolicyError` listing every problem."""
    policy_set, errors, _warnings = check_policies(paths, backends, warn=False)
    if policy_set is None:
        raise PolicyError(errors)
    return policy_set


def parse_policies(
    sources: Sequence[tuple[str, str]], backends: Sequence[BackendFacts]
) -> PolicySet:
    """`load_policies` for (name, YAML text) pairs already in memory."""
    policy_set, errors, _warnings = check_sources(sources, backends, warn=False)
    if policy_set is None:
        raise PolicyError(errors)
    return policy_set


def check_policies(
    paths: Sequence[Path | str],
    backends: Sequence[BackendFacts],
    tenants: Sequence[str] = (),
    *,
    tenants_source: str = "<config>",
    tenant_models: Mapping[str, Collection[str]] | None = None,
    warn: bool = True,
) -> CheckResult:
    """Validate policy files: (set or None, errors, warnings). Never raises for bad input.

    `tenants` are the tenant ids the gateway knows; a tenant among them without a policy
    (denied everything) is a warning, as is a policy naming a tenant not among them, and
    each is checked for traffic that would all go hosted (for the models `tenant_models`
    gives it, `*` for all; default all). `warn=False` skips the warnings (the server
    discards them).
    """
    files, errors = discover(Path(p) for p in paths)
    sources: list[tuple[str, str]] = []
    for file in files:
        try:
            sources.append((str(file), read_small_file(file, MAX_POLICY_FILE).decode("utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            unreadable = isinstance(exc, OSError)
            issue = PolicyIssue(str(file), None, None, "", f"cannot read: {exc}", unreadable)
            errors.append(issue)
    if not files and not errors:
        errors.append(PolicyIssue("<policies>", None, None, "", "no policy paths given"))
    policy_set, more, warnings = check_sources(
        sources,
        backends,
        tenants,
        tenants_source=tenants_source,
        tenant_models=tenant_models,
        require_policies=not errors,
        warn=warn,
    )
    errors += more
    return (policy_set if not errors else None), errors, warnings


def check_sources(
    sources: Sequence[tuple[str, str]],
    backends: Sequence[BackendFacts],
    tenants: Sequence[str] = (),
    *,
    tenants_source: str = "<config>",
    tenant_models: Mapping[str, Collection[str]] | None = None,
    require_policies: bool = True,
    warn: bool = True,
) -> CheckResult:
    """`check_policies` for (name, YAML text) pairs already in memory."""
    errors: list[PolicyIssue] = []
    policies: list[tuple[Document, PolicyDocument]] = []
    set_docs: list[tuple[Document, PolicySetDocument]] = []
    for name, text in sources:
        documents, issues = read_documents(name, text)
        errors += issues
        for document in documents:
            kind = _kind(document, errors)
            if kind == "Policy":
                policy, issues = _validate(document, PolicyDocument)
                errors += issues
                if policy is not None:
                    policies.append((document, policy))
            elif kind == "PolicySet":
                set_doc, issues = _validate(document, PolicySetDocument)
                errors += issues
                if set_doc is not None:
                    set_docs.append((document, set_doc))
    errors += _cross_check(policies, set_docs)
    if require_policies and not policies and not errors:
        where = sources[0][0] if sources else "<policies>"
        errors.append(
            PolicyIssue(where, None, None, "", "no Policy documents: every tenant would be denied")
        )
    if errors:
        return None, errors, []
    policy_set = compile_set(
        set_docs[0][1] if set_docs else None, [p for _, p in policies], backends
    )
    if not warn:
        return policy_set, [], []
    warnings = lint(policies, policy_set, backends, tenants, tenants_source, tenant_models)
    return policy_set, [], warnings


_NULL = (
    "has no value (YAML reads an empty value as null): write the value, [] for an empty "
    "list, or leave the key out; an empty `allow:` is not `allow: []` (which allows nothing)"
)


def _validate(document: Document, model: type[Doc]) -> tuple[Doc | None, list[PolicyIssue]]:
    """`validate`, refusing every key written with no value. Leaving a key out means its
    default, and for `allow` the default is "everything": a key written empty (`allow:`
    with its entries commented out, `allow: ~`) reads as a restriction, so it is refused
    rather than taken for the key left out."""
    nulls = [document.issue(path, _NULL) for path in _null_paths(document.data, ())]
    found, issues = validate(document, model)
    where = {issue.path for issue in nulls}
    issues = nulls + [issue for issue in issues if issue.path not in where]
    return (found if not issues else None), issues


def _null_paths(data: object, path: tuple[str | int, ...]) -> list[tuple[str | int, ...]]:
    if isinstance(data, dict):
        found: list[tuple[str | int, ...]] = []
        for key, value in data.items():
            if value is None:
                found.append((*path, key))
            else:
                found += _null_paths(value, (*path, key))
        return found
    if isinstance(data, list):
        return [p for i, item in enumerate(data) for p in _null_paths(item, (*path, i))]
    return []


def _kind(document: Document, errors: list[PolicyIssue]) -> str | None:
    data = document.data
    if not isinstance(data, dict):
        errors.append(
            document.issue((), "a policy document is a mapping: apiVersion, kind, metadata, spec")
        )
        return None
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if api_version != API_VERSION:
        message = (
            "apiVersion is missing"
            if api_version is None
            else f"unsupported apiVersion {api_version!r}"
        )
        errors.append(
            document.issue(("apiVersion",), f"{message} (this owngate reads {API_VERSION})")
        )
        return None
    if kind in ("Policy", "PolicySet"):
        return str(kind)
    if kind == "PolicyTest":
        message = "this is a test case file: run it with `owngate policy test`, not as a policy"
    else:
        message = f"unknown kind {kind!r} (expected Policy or PolicySet)"
    errors.append(document.issue(("kind",), message))
    return None


def _where(document: Document, path: tuple[str | int, ...]) -> str:
    line = document.marks.get(path, (None, None))[0]
    return f"{document.file}:{line}" if line is not None else document.file


def _cross_check(
    policies: list[tuple[Document, PolicyDocument]],
    set_docs: list[tuple[Document, PolicySetDocument]],
) -> list[PolicyIssue]:
    errors: list[PolicyIssue] = []
    for document, _ in set_docs[1:]:
        first = _where(set_docs[0][0], ())
        errors.append(document.issue(("kind",), f"a second PolicySet document (first at {first})"))
    seen_ids: dict[str, Document] = {}
    bound: dict[str, tuple[str, Document, tuple[str | int, ...]]] = {}
    for document, policy in policies:
        pid = policy.metadata.id
        if pid in seen_ids:
            at = _where(seen_ids[pid], ("metadata", "id"))
            errors.append(
                document.issue(("metadata", "id"), f"policy id {pid!r} is also used at {at}")
            )
            continue
        seen_ids[pid] = document
        errors += _check_defaults(document, policy)
        for i, tenant in enumerate(policy.spec.tenants):
            path = ("spec", "tenants", i)
            if tenant in bound:
                other, other_doc, other_path = bound[tenant]
                errors.append(
                    document.issue(
                        path,
                        f"tenant {tenant!r} is already bound to policy {other!r} at "
                        f"{_where(other_doc, other_path)}; a tenant has exactly one policy",
                    )
                )
            else:
                bound[tenant] = (pid, document, path)
    return errors


def _check_defaults(document: Document, policy: PolicyDocument) -> list[PolicyIssue]:
    """A default data class must be one the policy defines, for one of its tenants."""
    spec = policy.spec
    defined = ", ".join(sorted(spec.data_classes)) or "none"
    errors: list[PolicyIssue] = []
    wanted: list[tuple[tuple[str | int, ...], str]] = []
    if spec.default_data_class is not None:
        wanted.append((("spec", "default_data_class"), spec.default_data_class))
    for tenant, name in spec.default_data_class_by_tenant.items():
        path: tuple[str | int, ...] = ("spec", "default_data_class_by_tenant", tenant)
        wanted.append((path, name))
        if tenant not in spec.tenants:
            errors.append(
                document.issue(path, f"tenant {tenant!r} is not among this policy's tenants")
            )
    errors += [
        document.issue(
            path,
            f"default data class {name!r} is not defined in spec.data_classes (defined: {defined})",
        )
        for path, name in wanted
        if name not in spec.data_classes
    ]
    return errors
