"""Pages a reader opens (README.md, REPORT.md): no heading twice, report blocks nested under the
page's own headings."""
import json
import re
from pathlib import Path

import pytest

from experiments import report
from experiments.io import write_json
from experiments.report.markdown import BLOCK, headings, nest, page_level
from test_report import fake_run

ROOT = Path(__file__).resolve().parents[1]


def norm(text: str) -> str:
    """A heading as a reader compares them: case, markup, a trailing "(...)" and a leading
    "The" do not make two headings different."""
    t = re.sub(r"[`*_]", "", text).lower().strip()
    t = re.sub(r"\s*\([^()]*\)$", "", t)
    return re.sub(r"^the\s+", "", re.sub(r"\s+", " ", t))


def repeated(md: str) -> list[str]:
    seen, out = set(), []
    for _, _, text in headings(md):
        if norm(text) in seen:
            out.append(text)
        seen.add(norm(text))
    return out


def too_shallow(page: str) -> list[str]:
    """Headings inside report blocks at or above the page heading they sit under."""
    return [f"{m.group(1)}:{m.group(2)}: {text}" for m in BLOCK.finditer(page)
            for _, lv, text in headings(m.group(0)) if lv <= page_level(page, m.start())]


def test_norm_and_headings_see_what_a_reader_sees():
    assert norm("The catalogue") == norm("Catalogue")
    assert norm("When does it flatline? (`+exp=phase`)") == norm("When does it flatline? (phase)")
    assert repeated("# A\n```\n# A shell comment\n# A\n```\n## B\n") == []
    assert repeated("## The catalogue\n\ntext\n\n## Catalogue\n") == ["Catalogue"]


def test_nest_drops_the_title_and_moves_subheadings_below_the_page_heading():
    block = "## Heads\n\ntable\n\n## d_v != d_k\n\nrows\n\n### detail\n"
    assert nest(block, 2) == "table\n\n### d_v != d_k\n\nrows\n\n#### detail\n"
    assert nest(block, 3).splitlines()[2] == "#### d_v != d_k"
    assert nest("text first\n\n## Sub\n", 2) == "text first\n\n### Sub\n"  # no title: nothing dropped
    assert nest(block, 0) == block  # no page heading above: left as REPORT.md has it


@pytest.mark.parametrize("page", ["README.md", "results/REPORT.md", "results/DOCTOR.md"])
def test_no_heading_appears_twice_on_a_committed_page(page):
    assert repeated((ROOT / page).read_text()) == []


def test_committed_readme_blocks_nest_under_its_headings():
    assert too_shallow((ROOT / "README.md").read_text()) == []


def _phase_run(d: Path, scale: str, init: str, flat: bool):
    fake_run(d, exp="phase_no_scaling", loss_end=4.0 if flat else 0.01, scale=scale)
    s = json.loads((d / "summary.json").read_text())
    s["config"]["model"].update(init=init, qk_gain=1.0, attention={"scale": scale, "d_k": 16, "score": "dot"})
    s["config"]["optim"]["eps"] = 1e-8
    s["config_hash"] = f"phase{scale}{init}"
    write_json(d / "summary.json", s)


def _heads_run(d: Path, h: int):
    d.mkdir(parents=True)
    cfg = {"data": {"max_copies": 4, "ordered": True, "shared_values": True, "n_values": 8},
           "model": {"n_heads": h, "n_layers": 1, "d_model": 32}, "train": {"steps": 800}, "seed": 0}
    final = {"acc/answer": 0.5 if h == 1 else 1.0, "loss/answer": 0.1, "loss/train": 0.1, "attn/fact_a": 0.5,
             "attn/fact_b": 0.5, "attn/split": 0.5, "attn/separated": 0.0, "acc/average_ceiling": 9 / 16,
             "params/attention": 4224}
    write_json(d / "summary.json", {"exp": "heads", "status": "completed", "role": "baseline", "seed": 0,
                                    "final": final, "config": cfg, "config_hash": f"heads{h}"})


def test_generated_report_and_readme_have_each_heading_once(tmp_path):
    """Every section's blocks, in a report and in a README whose headings already name them."""
    res = tmp_path / "results"
    for seed in (0, 1):
        ctrl = fake_run(res / "controls" / f"c{seed}", exp="baseline", seed=seed, role="control",
                        loss_end=0.01, measured=0.5, scale="sqrt_dk")
        fake_run(res / "runs" / f"no_scaling{seed}", seed=seed, control_dir=ctrl)
    for scale in ("sqrt_dk", "none"):
        for init in ("gpt2", "unit_variance"):
            _phase_run(res / "phase" / f"{scale}_{init}", scale, init, flat=scale == "none" and init != "gpt2")
    for h in (1, 2, 4, 8):
        _heads_run(res / "heads" / str(h), h)
    write_json(res / "bench" / "cost.json", {"bench": "cost", "d": 8, "exact": True, "predicted": 16,
                                             "counted": 16, "timed": 16, "rows": []})
    readme = tmp_path / "README.md"
    readme.write_text("# Suite\n\n## The catalogue\n\nintro\n\n<!-- BEGIN report:catalogue -->\n"
                      "<!-- END report:catalogue -->\n\n### Example: no_scaling\n\n"
                      "<!-- BEGIN report:figure:no_scaling -->\n<!-- END report:figure:no_scaling -->\n\n"
                      "## When does a missing sqrt(d_k) flatline training? (`+exp=phase_no_scaling`)\n\n"
                      "<!-- BEGIN report:phase -->\n<!-- END report:phase -->\n\n## Heads\n\n"
                      "<!-- BEGIN report:heads -->\n<!-- END report:heads -->\n\n## Benchmarks\n\n"
                      "```\n# Benchmarks\n```\n\n<!-- BEGIN report:bench -->\n<!-- END report:bench -->\n")
    md = report.build([res], res, readme).read_text()
    tops = [text for _, lv, text in headings(md) if lv == 2]
    assert ["Catalogue", "Verdict per seed", "Per experiment"] == tops[:3]
    assert any(t.startswith("When does a missing sqrt(d_k)") for t in tops)
    assert "Heads: one softmax against several" in tops and "Benchmarks" in tops and "What runs write to disk" in tops
    assert repeated(md) == []
    page = readme.read_text()
    assert repeated(page) == [] and too_shallow(page) == []
    assert "| [no_scaling](results/REPORT.md#no_scaling) |" in page and "](results/figures/phase_plateau.png)" in page  # blocks were filled
    assert "Look at:" in page.split("report:figure:no_scaling")[1]


def test_phase_cell_labels_contrast_with_the_cell_and_mark_capped_cells():
    import matplotlib.pyplot as plt

    from experiments.report.sections.phase import _cell_text, _text_colour
    magma = plt.get_cmap("magma_r")
    assert _text_colour(magma(1.0)) == "white" and _text_colour(magma(0.0)) == "black"
    cell = {"plateau": 600.0, "budget": 600, "flat": True, "pred_std": 16.0, "diverged": 0, "final": float("nan")}
    assert _cell_text(cell, "plateau") == "600+\nσ≈16"
    assert _cell_text({**cell, "flat": False}, "plateau") == "600\nσ≈16"
    assert _cell_text({**cell, "diverged": 2}, "final").startswith("diverged")


def test_look_at_names_the_panel_of_each_check_and_no_measured_number():
    from experiments.report.figures import look_at
    exp = {"expect": ["plateau", "entropy", "grads", "kv"],
           "checks": {"plateau": {"name": "stays at chance", "kind": "plateau", "metric": "loss/copy"},
                      "entropy": {"name": "entropy halved", "kind": "ratio", "metric": "attn/entropy/L0", "at": 0},
                      "grads": {"name": "grad ratio", "kind": "ratio", "metric": "grad/scores/L0", "report_only": True},
                      "kv": {"name": "cache smaller", "kind": "near", "metric": "kv/bytes"}}}
    text = look_at(exp, "no_scaling", "baseline")
    assert text == ("Look at: solid red (no_scaling) against dashed blue (its control `baseline`): "
                    "the loss panel (stays at chance); the entropy panel at step 0 (entropy halved); "
                    "every check per seed against its threshold: the verdict panel (right).")
    off_panel = look_at({"expect": ["kv"], "checks": exp["checks"]}, "kv_sharing", None)
    assert "cache smaller" in off_panel and "the verdict panel" in off_panel
    diverged = {"expect": ["nan"], "checks": {"nan": {"name": "NaN", "kind": "status", "value": "diverged"}}}
    assert "where the solid curves end" in look_at(diverged, "naive_softmax", "stable")
