"""Parses the YAML examples and prints, as JSON, the shell scripts they embed.

Used by tests/examples.rs (which runs `bash -n` on each script and checks every
`mqa-fuzz` subcommand and flag). Exits 3 if PyYAML is missing so the test can say so.
Structural checks that YAML parsing alone would miss are asserted here too.
"""
import json
import sys

try:
    import yaml
except ImportError:
    sys.exit(3)


def workflow_scripts(doc, path):
    # YAML 1.1 (PyYAML) reads the key `on` as True.
    assert "jobs" in doc and ("on" in doc or True in doc), f"{path}: not a GitHub Actions workflow"
    out = []
    for name, job in doc["jobs"].items():
        assert "runs-on" in job and "steps" in job, f"{path}: job {name} lacks runs-on/steps"
        for step in job["steps"]:
            assert "run" in step or "uses" in step, f"{path}: job {name}: a step needs run or uses"
            if "run" in step:
                out.append(step["run"])
    return out


def k8s_scripts(doc, path):
    assert "apiVersion" in doc and "kind" in doc, f"{path}: not a Kubernetes object"
    out = []
    if doc["kind"] != "Job":
        return out
    spec = doc["spec"]
    for c in spec["template"]["spec"]["containers"]:
        if spec.get("completionMode") == "Indexed":
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env.get("JOB_COMPLETIONS") == str(spec["completions"]), (
                f"{path}: JOB_COMPLETIONS must equal .spec.completions ({spec['completions']})"
            )
        cmd = c.get("command", [])
        if cmd[:1] in (["/bin/bash"], ["bash"], ["/bin/sh"], ["sh"]) and "-c" in cmd:
            out.extend(c["args"][:1])
    return out


result = {}
for path in sys.argv[1:]:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    assert docs, f"{path}: empty"
    scripts = []
    for doc in docs:
        if "jobs" in doc:
            scripts += workflow_scripts(doc, path)
        else:
            scripts += k8s_scripts(doc, path)
    result[path] = scripts
print(json.dumps(result))
