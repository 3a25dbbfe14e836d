"""No llama.cpp assert reaches a user: a seeded sweep of option values for `run` and the
Python API on the tiny model ends every combination in a result or a one-line error.

llama.cpp answers a bad combination with GGML_ASSERT, which aborts the whole process, so
the sweep runs in one child process that prints a JSON line per combination before it
tries the next: a child killed by a signal names the combination that killed it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

from cli_helpers import cli_env

_CHILD = textwrap.dedent("""
    import io, json, sys
    from contextlib import redirect_stderr, redirect_stdout
    from inferenceos.cli.main import main
    import inferenceos
    from inferenceos.errors import InferenceOSError

    model = sys.argv[1]
    for line in sys.stdin:
        case = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with redirect_stdout(out), redirect_stderr(err):
            if case["kind"] == "cli":
                sys.argv = ["inferenceos", "run", model, *case["args"]]
                try:
                    main()
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
            else:
                try:
                    with inferenceos.load(model, **case["load"]) as m:
                        m.generate(case["prompt"], **case["options"])
                except InferenceOSError as exc:
                    code, err = 1, io.StringIO("error: " + str(exc) + "\\n")
        print(json.dumps({"case": case, "code": code, "err": err.getvalue()}), flush=True)
""")

PROMPTS = ["a", "ab " * 7, "abc " * 40, "ab" * 400]


def _cli_case(rng: random.Random) -> dict[str, object]:
    args = ["-p", rng.choice(PROMPTS), "--raw", "--temperature", "0",
            "-n", str(rng.choice([1, 4, 40, 100000])),
            "--ctx", str(rng.choice([16, 17, 20, 31, 33, 64, 255, 300, 4096])),
            "--threads", str(rng.choice([1, 2, 3]))]
    if rng.random() < 0.5:
        args += ["--batch", str(rng.choice([1, 7, 16, 17, 512, 100000]))]
    if rng.random() < 0.3:
        kv = rng.choice(["f16", "q8_0", "q4_0"])
        args += ["--cache-type-k", kv, "--cache-type-v", rng.choice(["f16", kv])]
    if rng.random() < 0.25:
        args += ["--draft", "ngram"]
    elif rng.random() < 0.2:
        args += ["--kv-policy", rng.choice(["streaming", "h2o"])]
    if rng.random() < 0.2:
        args += ["--ignore-eos"]
    return {"kind": "cli", "args": args}


def _api_case(rng: random.Random) -> dict[str, object]:
    load = {"n_ctx": rng.choice([0, 16, 20, 33, 300]), "batch": rng.choice([0, 1, 7, 16, 999]),
            "threads": rng.choice([0, 1])}
    options = {"max_tokens": rng.choice([1, 8, 100000]), "temperature": 0}
    return {"kind": "api", "load": load, "prompt": rng.choice(PROMPTS), "options": options}


def test_option_sweep_never_aborts(tiny_llama: Path, tmp_path: Path) -> None:
    rng = random.Random(24)
    cases = [_cli_case(rng) for _ in range(70)] + [_api_case(rng) for _ in range(30)]
    script = tmp_path / "sweep.py"
    script.write_text(_CHILD)
    r = subprocess.run([sys.executable, str(script), str(tiny_llama)], capture_output=True,
                       text=True, timeout=600, env=cli_env(),
                       input="".join(json.dumps(c) + "\n" for c in cases))
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0:
        nxt = cases[len(results)] if len(results) < len(cases) else None
        raise AssertionError(f"the sweep died (status {r.returncode}) on {nxt}\n"
                             f"{r.stderr[-2000:]}")
    assert len(results) == len(cases)
    for res in results:
        err = res["err"]
        assert "Traceback" not in err and "GGML_ASSERT" not in err, res
        if res["code"] != 0:
            lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
            assert len(lines) == 1, res  # one clear line (the plan lines may precede it)
    ok = sum(res["code"] == 0 for res in results)
    assert ok >= len(cases) // 2, f"only {ok} of {len(cases)} combinations ran"
