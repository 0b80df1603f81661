#!/usr/bin/env python3
"""kiln-verify: check one output of kiln_runner's text output against a `.expected` file.

Runner text: per output `output[i] shape=[d0,...] dtype=T` followed by a line of `%.6g` values,
or `output[i] value=v type=T` for non-tensor outputs; `# run k` starts run k; other lines are
ignored. Expected file: a shape line `[d0,...]` and a values line.
"""

import argparse
import math
import re
import sys

RUN_RE = re.compile(r"# run (\d+)")
HEADER_RE = re.compile(r"output\[(\d+)\]\s+(.*)")
TENSOR_RE = re.compile(r"shape=(.*) dtype=(\S+)")
SCALAR_RE = re.compile(r"value=(.*) type=(\S+)")
SHAPE_RE = re.compile(r"\[(?:\d+(?:,\d+)*)?\]")
# What printf %.6g can print (glibc writes "-nan" for a NaN with the sign bit set). Stricter than
# float(), which would also accept e.g. "1_0" or "infinity".
NUMBER_RE = re.compile(r"[+-]?(?:nan|inf|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)", re.IGNORECASE)
MAX_REPORTED = 10


def _parse_shape(text, where):
    """Returns (shape as tuple, None) or (None, problem)."""
    if not SHAPE_RE.fullmatch(text):
        return None, f"{where}: unparsable shape '{text}' (want [d0,d1,...] with no spaces)"
    return tuple(int(d) for d in text[1:-1].split(",") if d), None


def _parse_values(text, where):
    """Returns (list of (token, float), None) or (None, problem)."""
    tokens = text.split()
    bad = [t for t in tokens if not NUMBER_RE.fullmatch(t)]
    if bad:
        return None, f"{where}: unparsable value '{bad[0]}' in '{text}'"
    return [(t, float(t)) for t in tokens], None


def _find_output(lines, output_index, run_index):
    """Returns (line number of the requested header, None) or (None, problem)."""
    runs = {0} if not any(RUN_RE.fullmatch(line) for line in lines) else set()
    found = []
    run = 0
    for n, line in enumerate(lines, 1):
        if m := RUN_RE.fullmatch(line):
            run = int(m.group(1))
            runs.add(run)
        elif run == run_index and (m := HEADER_RE.fullmatch(line)) \
                and int(m.group(1)) == output_index:
            found.append(n)
    if run_index not in runs:
        return None, f"missing output[{output_index}]: runner text has no '# run {run_index}' line"
    if not found:
        return None, f"missing output[{output_index}] in run {run_index} of the runner text"
    if len(found) > 1:
        return None, (f"runner printed output[{output_index}] {len(found)} times in run "
                      f"{run_index} (lines {', '.join(map(str, found))})")
    return found[0], None


def _matches(actual, expected, atol):
    if math.isnan(actual) or math.isnan(expected):
        return math.isnan(actual) and math.isnan(expected)
    if math.isinf(actual) or math.isinf(expected):
        return actual == expected
    return abs(actual - expected) <= atol


def verify(runner_text: str, expected_text: str, atol: float, output_index: int = 0,
           run_index: int = 0) -> list[str]:
    """Returns the problems found; an empty list means the output matches."""
    problems = []

    exp_lines = [line.strip() for line in expected_text.splitlines()]
    while exp_lines and not exp_lines[-1]:
        exp_lines.pop()
    if not exp_lines:
        return ["expected file is empty"]
    exp_shape, problem = _parse_shape(exp_lines[0], "expected line 1")
    if problem:
        problems.append(problem)
    exp_values = None
    if len(exp_lines) < 2 or not exp_lines[1]:
        problems.append("expected file: missing values line (line 2)")
    else:
        exp_values, problem = _parse_values(exp_lines[1], "expected line 2")
        if problem:
            problems.append(problem)
    if len(exp_lines) > 2:
        problems.append(f"expected line 3: unexpected extra line '{exp_lines[2]}'")

    lines = [line.strip() for line in runner_text.splitlines()]
    n, problem = _find_output(lines, output_index, run_index)
    if problem:
        return problems + [problem]
    where = f"runner line {n}"
    header = HEADER_RE.fullmatch(lines[n - 1]).group(2)
    if m := SCALAR_RE.fullmatch(header):
        return problems + [f"{where}: output[{output_index}] is not a tensor "
                           f"(type={m.group(2)} value={m.group(1)})"]
    if not (m := TENSOR_RE.fullmatch(header)):
        return problems + [f"{where}: unparsable output header '{lines[n - 1]}'"]
    shape, problem = _parse_shape(m.group(1), where)
    if problem:
        problems.append(problem)
    elif exp_shape is not None and shape != exp_shape:
        problems.append(f"output[{output_index}] shape mismatch: actual {m.group(1)} "
                        f"expected {exp_lines[0]}")
    # The values line is the one right after the header; none when the text ends or another
    # output/run starts there.
    follows = lines[n] if n < len(lines) else ""
    if HEADER_RE.fullmatch(follows) or RUN_RE.fullmatch(follows):
        follows = ""
    values, problem = _parse_values(follows, f"runner line {n + 1}")
    if problem:
        return problems + [problem]
    if exp_values is None:
        return problems

    if len(values) < len(exp_values):
        problems.append(f"output[{output_index}]: runner printed {len(values)} values, "
                        f"expected file has {len(exp_values)}")
    bad = [(i, a, e) for i, (a, e) in enumerate(zip(values, exp_values))
           if not _matches(a[1], e[1], atol)]
    for i, (a_tok, a), (e_tok, e) in bad[:MAX_REPORTED]:
        diff = abs(a - e)
        # Near the boundary, 6 digits can round the diff down to atol; show it in full there.
        shown = f"{diff:.6g}" if float(f"{diff:.6g}") > atol else repr(diff)
        why = f"diff {shown} > atol {atol:g}" if diff > atol else "NaN mismatch"
        problems.append(f"output[{output_index}] value[{i}]: actual {a_tok} "
                        f"expected {e_tok} ({why})")
    if len(bad) > MAX_REPORTED:
        problems.append(f"output[{output_index}]: {len(bad) - MAX_REPORTED} more values outside "
                        f"atol {atol:g} ({len(bad)} of {min(len(values), len(exp_values))} in all)")
    return problems


def _read(parser, path, what):
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        parser.error(f"cannot read {what} '{path}': {e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="kiln-verify", description="Check kiln_runner output against a .expected file.")
    parser.add_argument("--expected", required=True, metavar="FILE",
                        help="expected file: shape line, then values line")
    parser.add_argument("--atol", type=float, default=1e-5,
                        help="absolute tolerance, 0 for exact (default 1e-5)")
    parser.add_argument("--output", type=int, default=0, metavar="I",
                        help="output index to check (default 0)")
    parser.add_argument("--run", type=int, default=0, metavar="K",
                        help="run to check, as numbered by '# run K' lines (default 0)")
    parser.add_argument("runner_output", nargs="?", default="-", metavar="RUNNER_OUTPUT_FILE",
                        help="runner output text (default: stdin)")
    args = parser.parse_args(argv)
    if not args.atol >= 0:  # also rejects nan
        parser.error(f"--atol must be a non-negative number, got {args.atol}")
    if args.output < 0 or args.run < 0:
        parser.error("--output and --run must be non-negative")

    expected_text = _read(parser, args.expected, "expected file")
    runner_text = _read(parser, args.runner_output, "runner output")
    problems = verify(runner_text, expected_text, args.atol, args.output, args.run)
    if problems:
        for p in problems:
            print(f"kiln-verify: FAIL {p}")
        return 1
    shape, n = expected_text.split()[0], len(expected_text.split()) - 1
    print(f"kiln-verify: OK output[{args.output}] shape={shape} {n} values "
          f"within atol={args.atol:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
