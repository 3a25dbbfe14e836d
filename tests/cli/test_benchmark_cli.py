"""`inferenceos benchmark` on a tiny model: the matrix through the real engine, `--json`,
the PNG chart (a real, non-blank image that shows the rows), telemetry rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import run_cli, run_main
from inferenceos import telemetry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASELINE_RGB = (0xD9, 0x5F, 0x02)  # chart.py's baseline colour
ROW_RGB = (0x1B, 0x9E, 0x77)


@pytest.fixture(scope="module")
def benchmarked(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """One small matrix (1 thread count x 1 batch x 1 context x 2 concurrencies) with a
    chart: (exit code, stdout, stderr, chart path, home)."""
    home = tmp_path_factory.mktemp("bench-home")
    chart = home / "matrix.png"
    proc = run_cli("benchmark", str(tiny_llama), "--threads", "1", "--batch", "64",
                   "--ctx", "256", "--concurrency", "1,2", "--prompt-tokens", "32",
                   "--gen-tokens", "8", "--json", "--chart", str(chart),
                   INFERENCEOS_HOME=str(home))
    return proc.returncode, proc.stdout, proc.stderr, chart, home


def test_json_has_the_baseline_row_first(benchmarked: tuple) -> None:
    code, out, err, chart, _ = benchmarked
    assert code == 0, err
    data = json.loads(out)
    rows = data["rows"]
    assert len(rows) == 3  # the baseline + 1 x 1 x 1 x 2
    base = rows[0]
    assert base["baseline"] and base["n_batch"] == 2048 and base["n_ctx"] == 4096
    assert base == {**data["baseline"], "vs_baseline": base["vs_baseline"]}
    assert base["vs_baseline"]["decode_tps"] == 1.0
    assert [(r["threads"], r["n_batch"], r["n_ctx"], r["concurrency"]) for r in rows[1:]] == [
        (1, 64, 256, 1),
        (1, 64, 256, 2),
    ]
    for r in rows:
        assert not r["error"]
        assert r["prefill_tps"] > 0 and r["decode_tps"] > 0 and r["ttft_s"] > 0
        assert set(r["vs_baseline"]) == {"prefill_tps", "decode_tps", "total_tps"}
    two = rows[2]
    # two streams: the total is both streams' decode rates together
    assert two["total_tps"] == pytest.approx(2 * two["decode_tps"], rel=0.02)
    assert data["chart"] == str(chart)


def test_chart_is_a_valid_png_that_shows_the_rows(benchmarked: tuple) -> None:
    import matplotlib.image

    chart: Path = benchmarked[3]
    assert chart.read_bytes()[:8] == PNG_MAGIC
    img = matplotlib.image.imread(chart)  # decodes the whole file: a truncated one fails
    assert img.shape[0] > 200 and img.shape[1] > 600
    rgb = (img[..., :3] * 255).round().astype(int)
    not_white = (rgb < 245).any(axis=-1).mean()
    assert not_white > 0.02, "the chart is blank"

    def pixels(colour: tuple[int, int, int]) -> int:
        return int((np.abs(rgb - np.array(colour)) <= 3).all(axis=-1).sum())

    # the baseline bars and the other rows' bars are both drawn
    assert pixels(BASELINE_RGB) > 100 and pixels(ROW_RGB) > 100


def test_each_stream_is_recorded(benchmarked: tuple, tiny_llama: Path) -> None:
    home = benchmarked[4]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("INFERENCEOS_HOME", str(home))
        rows = telemetry.generations(tiny_llama, source="benchmark")
    # baseline 1 stream, then 1 and 2 streams: warm-up streams are not recorded
    assert len(rows) == 4
    assert sorted(r.concurrency for r in rows) == [1, 1, 2, 2]


def test_table_output(
    tiny_llama: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_main(["benchmark", str(tiny_llama), "--threads", "1", "--batch", "64",
                               "--ctx", "128", "--concurrency", "1", "--prompt-tokens", "16",
                               "--gen-tokens", "4"], capsys, monkeypatch)
    assert code == 0, err
    assert "prefill" in out and "decode" in out
    lines = [line for line in out.splitlines() if line.strip().startswith("*")]
    assert len(lines) == 1 and "2048" in lines[0]  # the baseline row, marked


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--threads", "a,b"], "--threads"),
        (["--concurrency", "0"], "--concurrency"),
        (["--chart", "out.jpg"], ".png"),
        (["--chart", "/no/such/dir/x.png"], "does not exist"),
        (["--ctx", "32", "--prompt-tokens", "32"], "cannot hold"),
    ],
)
def test_bad_options_are_one_line_errors(
    tiny_llama: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    needle: str,
) -> None:
    code, _out, err = run_main(["benchmark", str(tiny_llama), *args], capsys, monkeypatch)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_collapsed_baseline_stays_visible_on_a_log_axis(tmp_path: Path) -> None:
    """Two threads fighting a busy neighbour ran at 3.5 t/s beside 7668 (measured): on
    a linear axis the baseline's bar would be under a pixel wide."""
    import matplotlib.image

    from inferenceos.tuning.chart import write_chart
    from inferenceos.tuning.matrix import Point, Row

    rows = [Row(Point(2, 2048, 4096, 1, baseline=True), 61.2, 3.5, 3.5, 0.5),
            Row(Point(1, 64, 256, 1), 43300.0, 7668.0, 7668.0, 0.001)]
    chart = write_chart(rows, tmp_path / "c.png", "collapsed")
    rgb = (matplotlib.image.imread(chart)[..., :3] * 255).round().astype(int)
    base = int((np.abs(rgb - np.array(BASELINE_RGB)) <= 3).all(axis=-1).sum())
    assert base > 100
