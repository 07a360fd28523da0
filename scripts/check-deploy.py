#!/usr/bin/env python3
"""Checks deploy/ without a cluster: deploy/kubernetes.yaml parses, every object names its kind,
every Service selects a Deployment's pods and targets a port its containers declare, every probe
and Prometheus annotation points at a declared port, and every `--flag` given to `wllm serve` (the
manifest's args and the Dockerfile's ENTRYPOINT) is one that `wllm serve --help` lists.

  scripts/check-deploy.py [path/to/wllm]     (default: target/release/wllm)
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

root = Path(__file__).resolve().parent.parent
wllm = sys.argv[1] if len(sys.argv) > 1 else str(root / "target/release/wllm")
errors = []


def fail(msg):
    errors.append(msg)


docs = [d for d in yaml.safe_load_all((root / "deploy/kubernetes.yaml").read_text()) if d is not None]
if not docs:
    fail("deploy/kubernetes.yaml holds no objects")
for d in docs:
    for key in ("apiVersion", "kind"):
        if not d.get(key):
            fail(f"an object lacks {key}: {json.dumps(d)[:80]}")
    if not d.get("metadata", {}).get("name"):
        fail(f"a {d.get('kind')} has no metadata.name")

deployments = [d for d in docs if d.get("kind") == "Deployment"]
services = [d for d in docs if d.get("kind") == "Service"]
accounts = {d["metadata"]["name"] for d in docs if d.get("kind") == "ServiceAccount"}


def containers(dep):
    spec = dep["spec"]["template"]["spec"]
    return spec.get("containers", []), spec.get("initContainers", [])


def port_names(dep):
    names, numbers = set(), set()
    for c in containers(dep)[0]:
        for p in c.get("ports", []):
            if "name" in p:
                names.add(p["name"])
            numbers.add(p["containerPort"])
    return names, numbers


for dep in deployments:
    name = dep["metadata"]["name"]
    sel = dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"].get("labels", {})
    if any(labels.get(k) != v for k, v in sel.items()):
        fail(f"Deployment {name}: its selector {sel} does not match its pods' labels {labels}")
    names, numbers = port_names(dep)
    sa = dep["spec"]["template"]["spec"].get("serviceAccountName")
    if sa and sa not in accounts:
        fail(f"Deployment {name}: ServiceAccount {sa} is not in the manifest")
    ann = dep["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/scrape") == "true" and int(ann.get("prometheus.io/port", 0)) not in numbers:
        fail(f"Deployment {name}: Prometheus scrapes port {ann.get('prometheus.io/port')}, not declared")
    mounts_ok = {v["name"] for v in dep["spec"]["template"]["spec"].get("volumes", [])}
    for c in containers(dep)[0] + containers(dep)[1]:
        for m in c.get("volumeMounts", []):
            if m["name"] not in mounts_ok:
                fail(f"Deployment {name}: container {c['name']} mounts unknown volume {m['name']}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe, {}).get("httpGet")
            if p and p["port"] not in names and p["port"] not in numbers:
                fail(f"Deployment {name}: {c['name']}'s {probe} uses port {p['port']}, not declared")

for svc in services:
    name = svc["metadata"]["name"]
    sel = svc["spec"].get("selector", {})
    matched = [
        d for d in deployments
        if all(d["spec"]["template"]["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())
    ]
    if not matched:
        fail(f"Service {name}: its selector {sel} matches no Deployment's pods")
    for p in svc["spec"].get("ports", []):
        t = p.get("targetPort", p["port"])
        if not any(t in port_names(d)[0] or t in port_names(d)[1] for d in matched):
            fail(f"Service {name}: targetPort {t} is no port of the pods it selects")

# Every flag handed to `wllm serve` exists.
try:
    help_text = subprocess.run([wllm, "serve", "--help"], capture_output=True, text=True, check=True).stdout
except (OSError, subprocess.CalledProcessError) as e:
    sys.exit(f"check-deploy: cannot run {wllm} serve --help ({e}); build it first (cargo build --release)")
known = set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))
entry = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", (root / "deploy/Dockerfile").read_text(), re.M)
if not entry:
    fail("deploy/Dockerfile has no ENTRYPOINT in exec form")
    entry_args = []
else:
    entry_args = json.loads(entry.group(1))
    if entry_args[:2] != ["wllm", "serve"]:
        fail(f"deploy/Dockerfile's ENTRYPOINT is not `wllm serve`: {entry_args}")
given = [("Dockerfile ENTRYPOINT", a) for a in entry_args]
wllm_deps = [d for d in deployments if any(c.get("image", "").startswith("wllm") for c in containers(d)[0])]
if not wllm_deps:
    fail("no Deployment runs the wllm image")
for d in wllm_deps:
    for c in containers(d)[0]:
        if c.get("image", "").startswith("wllm"):
            given += [(f"Deployment {d['metadata']['name']} args", a) for a in c.get("args", [])]
for where, a in given:
    if a.startswith("--") and a.split("=")[0] not in known:
        fail(f"{where}: `wllm serve` has no flag {a}")

if errors:
    print("check-deploy: " + "\ncheck-deploy: ".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"check-deploy: {len(docs)} objects in deploy/kubernetes.yaml and the Dockerfile's entrypoint are consistent")
