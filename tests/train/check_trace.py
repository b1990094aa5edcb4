#!/usr/bin/env python3
"""Checks a train::Profiler Chrome trace with Python's json module.

Runs the hidden Catch2 case "[.profiler_fixture]" of test_train (a small conv net's training
steps under the profiler, shapes recorded), then loads the file with json (refusing NaN and
Infinity, which are not JSON) and checks the "traceEvents" schema that Perfetto and
chrome://tracing read: complete events ("ph": "X") with name, cat, pid, tid, ts and dur in
microseconds; metadata events ("ph": "M") naming the process and threads; nesting on a thread
(a deeper event lies within its parent); the expected forward, backward and optimizer names.

Usage: check_trace.py --writer PATH/test_train
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def reject(constant):
    raise ValueError(f"not JSON: {constant}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writer", required=True)
    args = ap.parse_args()
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        env = dict(os.environ, DLTRAIN_PROFILE_FIXTURE=path)
        r = subprocess.run([args.writer, "[.profiler_fixture]"], env=env)
        if r.returncode != 0:
            print(f"check_trace.py: {args.writer} failed ({r.returncode})", file=sys.stderr)
            return 1
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, parse_constant=reject)

    check(isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), "traceEvents list")
    events = doc["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X"]
    meta = [e for e in events if e.get("ph") == "M"]
    check(len(complete) + len(meta) == len(events), "only X and M events")
    check(len(complete) > 0, "complete events")
    for e in complete:
        for key, typ in (("name", str), ("cat", str), ("pid", int), ("tid", int),
                         ("ts", (int, float)), ("dur", (int, float))):
            check(isinstance(e.get(key), typ), f"{key} of {e}")
        check(e["ts"] >= 0 and e["dur"] >= 0, f"ts/dur of {e}")
        check(isinstance(e.get("args"), dict), f"args of {e}")
    names = {e["name"] for e in complete}
    check("linear_backward" in names or "mm_backward" in names, "linear's backward")
    for want in ("conv2d", "linear", "conv2d_backward", "SGD.step",
                 "autograd::backward", "forward", "backward"):
        check(want in names, f"an event named {want}")
    cats = {e["cat"] for e in complete}
    check({"cpu_op", "backward", "optimizer", "user_range"} <= cats, f"categories {cats}")
    check(any(e["name"] == "process_name" for e in meta), "process_name metadata")
    check(any(e["name"] == "thread_name" for e in meta), "thread_name metadata")
    conv = [e for e in complete if e["name"] == "conv2d"]
    check(all("Input Shapes" in e["args"] for e in conv), "conv2d input shapes")
    # Nesting: every event of depth d > 0 lies inside an event of depth d - 1 on its thread.
    cpu = [e for e in complete if e["cat"] != "cuda"]
    for e in cpu:
        d = e["args"]["depth"]
        if d == 0:
            continue
        parents = [p for p in cpu if p["tid"] == e["tid"] and p["args"]["depth"] == d - 1
                   and p["ts"] <= e["ts"] + 1e-3
                   and e["ts"] + e["dur"] <= p["ts"] + p["dur"] + 1e-3]
        check(len(parents) >= 1, f"a parent of {e['name']} at {e['ts']}")

    if failures:
        for f in failures[:20]:
            print("FAILED:", f, file=sys.stderr)
        print(f"check_trace.py: {len(failures)} failures", file=sys.stderr)
        return 1
    print(f"check_trace.py: {len(complete)} complete events, {len(names)} names: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
