#!/usr/bin/env python3
"""Turn CustomResourceDefinitions into the JSON schemas kubeconform reads.

    ci/crd_schemas.py OUTDIR CRD.yaml...

writes OUTDIR/<group>/<kind>_<version>.json (kind lower-cased) for every version of every
CRD, the layout of kubeconform's
`-schema-location 'OUTDIR/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json'`.
Each schema is the version's openAPIV3Schema made strict the way the API server treats
it: an object with `properties` refuses other keys (the server would prune them, so a
typo in values would vanish silently) unless it has x-kubernetes-preserve-unknown-fields;
x-kubernetes-int-or-string becomes "integer or string".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml


def strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if out.get("x-kubernetes-int-or-string") and "type" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def schemas(crd: dict[str, Any]) -> dict[Path, dict[str, Any]]:
    spec = crd["spec"]
    kind = spec["names"]["kind"].lower()
    out = {}
    for version in spec["versions"]:
        schema = version.get("schema", {}).get("openAPIV3Schema")
        if schema is None:
            raise SystemExit(f"{spec['group']} {kind} {version['name']}: no openAPIV3Schema")
        out[Path(spec["group"]) / f"{kind}_{version['name']}.json"] = strict(schema)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[0])
    written = 0
    for path in argv[1:]:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
        crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
        if not crds:
            raise SystemExit(f"{path}: no CustomResourceDefinition in it")
        for crd in crds:
            for rel, schema in schemas(crd).items():
                target = outdir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
                written += 1
    print(f"crd_schemas: wrote {written} schemas to {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
