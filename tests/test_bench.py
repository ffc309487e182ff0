"""Each benchmark at a tiny size, so none can rot; the counted figures must equal the formulas."""
import pytest

from conftest import SHAKESPEARE
from experiments import bench

needs_corpus = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no corpus at {SHAKESPEARE}")


def test_cost_counts_equal_formulas_and_cross_at_2d(capsys):
    out = bench.bench_cost(tiny=True)
    assert out["exact"]
    r = {row["T"]: row for row in out["rows"]}
    d = out["d"]
    assert r[2 * d]["attn_flops"] == r[2 * d]["proj_flops"]  # 2 T^2 d = 4 T d^2 at T = 2d
    assert r[d]["attn_flops"] < r[d]["proj_flops"] < r[4 * d]["attn_flops"]
    assert out["counted"] == out["predicted"] == 2 * d
    assert "crossover" in capsys.readouterr().out


def test_memory_explicit_weights_quadratic_sdpa_linear(capsys):
    out = bench.bench_memory(tiny=True)
    assert out["exact"] and out["sdpa_linear"]
    fp16 = [r for r in out["rows"] if r["dtype"] == "float16"]
    assert fp16[1]["explicit_square"] == 4 * fp16[0]["explicit_square"]  # T doubled: 4x
    assert all(r["explicit"] > r["sdpa"] for r in out["rows"])
    assert [x["per_layer"] for x in out["lesson"]] == [512 * bench.MiB, 2 * bench.GiB]
    assert [x["12_layers"] for x in out["lesson"]] == [6 * bench.GiB, 24 * bench.GiB]
    assert "512 MiB per layer, 6 GiB for 12 layers" in capsys.readouterr().out


@needs_corpus
def test_throughput_runs_all_three_loops(capsys):
    out = bench.bench_throughput(tiny=True)
    assert set(out["tokens_per_s"]) == {"bare", "ours, diagnostics off", "ours, diagnostics every 5"}
    assert all(v > 0 for v in out["tokens_per_s"].values())
    assert all(r > 0 for r in out["ratio"].values())  # no wall-time target asserted in a test
    assert "ratio to bare" in capsys.readouterr().out


@needs_corpus
def test_shakespeare_tiny_trains_and_cli_prints(capsys):
    assert bench.main(["shakespeare", "--tiny"]) == 0
    text = capsys.readouterr().out
    assert "val loss" in text and "tokens/s" in text


def test_cli_rejects_overrides_for_cost():
    with pytest.raises(SystemExit):
        bench.main(["cost", "model.d_model=8"])


def test_bench_json_feeds_the_report_section(tmp_path):
    from experiments.bench import main
    from experiments.sections import bench as section
    assert main(["cost", "--tiny", "--out", str(tmp_path / "bench" / "cost.json")]) == 0
    assert section.render([], tmp_path / "figures").count("| 32 | 1,048,576 | 1,048,576 |") == 1
    assert section.render([], tmp_path / "elsewhere" / "figures") is None
