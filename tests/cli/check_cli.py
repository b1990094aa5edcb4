#!/usr/bin/env python3
"""Checks the programs' command line (apps/common/cli.hpp) and their JSON reports.

  check_cli.py flags PROGRAM [PROGRAM...]   malformed values, unknown flags, --help: every flag of
                                            every program (and subcommand) that --help lists is
                                            given a value of the wrong kind for its type
  check_cli.py json OUT_DIR FASHION_MNIST GNN_TRACKING DATA_DIR
                                            runs tiny trainings and parses their --json reports
                                            strictly (NaN/Infinity refused), one of them diverged

Exit status 0 when every check holds; each failure is printed.
"""
import json
import os
import re
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


def help_flags(text):
    """(name, type) of each flag and positional argument in a cli::Flags --help text."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^  (?:-\w,)?(--(?:\[no-\])?[\w-]+|[A-Z][A-Z_]*)(?: (\S+))?", line)
        if m and m.group(1) != "--help":
            out.append((m.group(1), m.group(2) or ""))
    return out


def subcommands(text):
    names, inside = [], False
    for line in text.splitlines():
        if line.startswith("Subcommands:"):
            inside = True
        elif inside and re.match(r"^  [a-z]", line):
            names.append(line.split()[0])
        elif inside and line.strip() == "":
            inside = False
    return names


def malformed(kind):
    """Values a flag of this --help type must refuse, each with a word its message must hold."""
    if kind == "N":  # a whole number, none of ours negative
        return [("2.5", "whole number"), ("-1", ""), ("abc", "whole number")]
    if kind == "X":
        return [("abc", "not a number"), ("nan", "finite")]
    if kind in ("N,N,...", "T,T,..."):
        return [("1,x", ""), ("-1", "")]
    if re.fullmatch(r"[a-z0-9]+(\|[a-z0-9]+)+", kind):  # choices
        return [("bogus", "")]
    return []


def expect_usage_error(argv, flag, word, what):
    rc, out, err = run(argv)
    check(rc == 2 and flag in err and "error" in err and word in err,
          f"{what}: exit {rc} (want 2), stderr names {flag}{' and says ' + repr(word) if word else ''}: "
          f"{err.strip()[:200]!r}")


def flags_of(prog, prefix, name, help_text):
    # The course's four malformed values, whether or not the program has the flag (an unknown
    # flag is named too), then every listed flag with values of the wrong kind.
    for args, flag in ((["--epochs", "2.5"], "--epochs"), (["--lr", "abc"], "--lr"),
                       (["--threads", "-1"], "--threads"), (["--no-such-flag"], "--no-such-flag"),
                       (["--no-such-flag=3"], "--no-such-flag")):
        expect_usage_error(prefix + args, flag, "", f"{name} {' '.join(args)}")
    count, positionals = 0, []
    for flag, kind in help_flags(help_text):
        for value, word in malformed(kind):
            # A positional argument comes after valid placeholders for the ones before it.
            argv = [flag, value] if flag.startswith("--") else positionals + [value]
            expect_usage_error(prefix + argv, flag, word, f"{name} {flag} {value}")
            count += 1
        if not flag.startswith("--"):
            positionals.append("1" if kind in ("N", "X") else "x")
    return count


def argparse_flags(prog, name):
    """A Python tool on argparse (tools/dltrain-plot): the same promises."""
    for args, flag in ((["--dpi", "2.5"], "--dpi"), (["--dpi", "-1"], "--dpi"),
                       (["--smooth", "abc"], "--smooth"), (["--smooth", "nan"], "--smooth"),
                       (["--tags", "("], "--tags"), (["--no-such-flag"], "--no-such-flag")):
        expect_usage_error([prog, "metrics.csv"] + args, flag, "", f"{name} {' '.join(args)}")
    rc, out, _ = run([prog, "--help"])
    check(rc == 0 and "--dpi" in out, f"{name} --help: exit {rc} (want 0)")


def flags(programs):
    for prog in programs:
        name = os.path.basename(prog)
        with open(prog, "rb") as f:
            if f.read(2) == b"#!":
                argparse_flags(prog, name)
                continue
        rc, help_text, _ = run([prog, "--help"])
        check(rc == 0 and "Usage:" in help_text, f"{name} --help: exit {rc} (want 0)")
        if "Training (hyper-parameters):" in help_text:  # an example: the course's groups
            groups = ["Training (hyper-parameters):", "Test mode:", "Checkpoint and report:"]
            check(all(g in help_text for g in groups) and "[default: " in help_text,
                  f"{name} --help lists the course's groups and the defaults")
            if "--optimizer" in help_text:  # the large-batch and augmentation lessons' groups
                # (a program without augmentation flags, fashion_mnist, has the first alone)
                lessons = [g for g in ("Large batches (", "Data augmentation:")
                           if g == "Large batches (" or g in help_text]
                at = [help_text.find(g) for g in lessons + ["Test mode:"]]
                check(min(at) >= 0 and at == sorted(at),
                      f"{name} --help groups the large-batch and augmentation flags after training")
            check(rc == 0 and all(f in help_text for f in ("--tensorboard", "--metrics", "--profile",
                                                           "--json")),
                  f"{name} --help lists --metrics, --tensorboard, --profile and --json")
        count = flags_of(prog, [prog], name, help_text)
        subs = subcommands(help_text)
        for sub in subs:
            rc, sub_help, _ = run([prog, sub, "--help"])
            check(rc == 0 and "Usage:" in sub_help, f"{name} {sub} --help: exit {rc} (want 0)")
            count += flags_of(prog, [prog, sub], f"{name} {sub}", sub_help)
        if subs:
            expect_usage_error([prog, "bogus"], "bogus", "not a subcommand", f"{name} bogus")
        print(f"      {name}: {count} malformed values of its flags refused"
              f"{', subcommands ' + ', '.join(subs) if subs else ''}")


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
