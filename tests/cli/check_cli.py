#!/usr/bin/env python3
"""Checks the programs' command line (examples/common/cli.hpp) and their JSON reports.

  check_cli.py flags PROGRAM [PROGRAM...]   malformed values, unknown flags, --help
  check_cli.py json OUT_DIR FASHION_MNIST GNN_TRACKING DATA_DIR
                                            runs tiny trainings and parses their --json reports
                                            strictly (NaN/Infinity refused), one of them diverged

Exit status 0 when every check holds; each failure is printed.
"""
import json
import os
import subprocess
import sys

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def strict_load(path):
    def refuse(name):
        raise ValueError(f"{path}: {name} is not JSON")
    with open(path) as f:
        return json.loads(f.read(), parse_constant=refuse)


def flags(programs):
    for prog in programs:
        name = os.path.basename(prog)
        # A required --data would be reported first: give it (the value is never read).
        extra = ["--data", "/nonexistent"] if "--data DIR" in run([prog, "--help"])[1] else []
        for args, flag in ((["--epochs", "2.5"], "--epochs"), (["--lr", "abc"], "--lr"),
                           (["--batch-size", "-4"], "--batch-size"),
                           (["--no-such-flag"], "--no-such-flag")):
            rc, out, err = run([prog] + extra + args)
            check(rc == 2 and flag in err and "error" in err,
                  f"{name} {' '.join(args)}: exit {rc} (want 2), stderr names {flag}: {err.strip()!r}")
        rc, out, err = run([prog, "--help"])
        groups = ["Training (hyper-parameters):", "Test mode:", "Checkpoint and report:"]
        check(rc == 0 and all(g in out for g in groups) and "[default: " in out,
              f"{name} --help: exit {rc} (want 0), lists the groups and defaults")


def reports(out_dir, fashion, gnn, data):
    os.makedirs(out_dir, exist_ok=True)
    runs = {
        "fashion_mnist": [fashion, "--data", data, "--test", "--test-nsteps", "5", "--epochs", "1"],
        # A learning rate that makes the loss overflow: the report must still be valid JSON.
        "fashion_mnist_diverged": [fashion, "--data", data, "--test", "--test-nsteps", "5",
                                   "--epochs", "1", "--lr", "1e30"],
        "gnn_tracking": [gnn, "--test", "--train-events", "8", "--test-events", "2",
                         "--particles", "20", "--epochs", "1"],
    }
    for key, argv in runs.items():
        path = os.path.join(out_dir, key + ".json")
        if os.path.exists(path):
            os.remove(path)
        rc, out, err = run(argv + ["--json", path])
        check(rc == 0 and os.path.exists(path), f"{key}: exit {rc}, wrote {path} {err.strip()[-300:]}")
        if not os.path.exists(path):
            continue
        try:
            r = strict_load(path)
        except ValueError as e:
            check(False, f"{key}: strict JSON parse: {e}")
            continue
        check(isinstance(r.get("epochs"), list) and len(r["epochs"]) == 1,
              f"{key}: one epoch in the report")
        if key == "fashion_mnist_diverged":
            nf = r.get("nonfinite", {})
            check(len(nf) > 0 and all(v in ("nan", "inf", "-inf") for v in nf.values()) and
                  any("not finite" in w for w in r.get("warnings", [])),
                  f"{key}: non-finite values named in 'nonfinite' and 'warnings': {nf}")
            check(all(r["epochs"][0][p.split("/")[-1]] is None for p in nf if p.startswith("/epochs/0/")),
                  f"{key}: the non-finite values are null")
        else:
            check("nonfinite" not in r, f"{key}: no non-finite values")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "flags":
        flags(sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "json":
        reports(*sys.argv[2:])
    else:
        sys.exit(__doc__)
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
