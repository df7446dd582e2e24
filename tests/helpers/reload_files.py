"""Files a config-reload test writes: one policy admitting everything, the same policy at a
version and residency the test names, one denying every backend to `phi`, the policy set
naming the label header, the config section that loads them, and a write that
gives each file the modification time the test names (each write its own stamp, whatever
the clock)."""

from __future__ import annotations

import os
from pathlib import Path

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
"""
VERSIONED_POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: [REGION]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
"""
POLICY_SECTION = "policy:\n  paths: [policies]\n"
LABEL_SET = """\
apiVersion: policy.owngate.dev/v1
kind: PolicySet
metadata: {id: s, version: "1"}
spec: {data_class_header: HEADER}
"""  # the policy set naming the header labels are read from (`HEADER` replaced)
PHI_DENIED = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
  data_classes:
    phi: {backends: {deny: ["*"]}}
"""  # policy `p`: every backend for `acme`, none for a request labelled `phi`


def write(path: Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def versioned_policy(version: str, region: str) -> str:
    """Policy `p` for tenant `acme` at `version`, allowing residency `region` (a YAML
    scalar: `eu`, `'"*"'`), with no fallback."""
    return VERSIONED_POLICY.replace("VERSION", version).replace("REGION", region)
