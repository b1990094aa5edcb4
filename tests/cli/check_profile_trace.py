#!/usr/bin/env python3
"""Checks the Chrome trace that an example's --profile wrote (ctest
example_fashion_mnist_profile_trace): valid JSON with "traceEvents", exactly STEPS of each of the
step's ranges (forward, backward, optimizer) and of the optimizer's own scope (SGD.step).

The printed ops table lists only the 15 ops with the most self time, an order that depends on
the machine's load; what the window recorded is read from the trace instead.

  check_profile_trace.py TRACE.json STEPS
"""
import collections
import json
import sys


def main():
    path, steps = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        trace = json.load(f)
    names = collections.Counter(e.get("name") for e in trace["traceEvents"] if e.get("ph") == "X")
    bad = 0
    for name in ("forward", "backward", "optimizer", "SGD.step"):
        ok = names[name] == steps
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: {names[name]} events (want {steps})")
    for name in ("conv2d", "conv2d_backward"):
        ok = names[name] >= steps
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: {names[name]} events (want at least {steps})")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
