"""The phase section's judgement: unscaled against its scaled twin."""
from experiments.sections.phase import pairs_table, predicted_score_std


def cell(scale, plateau, flat, init="unit_variance", d_k=256):
    return {"optim": "adamw", "init": init, "d_k": d_k, "scale": scale, "plateau": plateau, "flat": flat,
            "pred_std": 16.0, "final": 1.0}


def verdicts(cells):
    return [row.rsplit("|", 2)[1].strip() for row in pairs_table(cells) if row.startswith("| adamw")]


def test_flatline_holds_only_against_a_scaled_twin_that_left_the_plateau():
    assert verdicts([cell("scaled", 40, False), cell("unscaled", 600, True)]) == ["holds"]
    assert verdicts([cell("scaled", 100, False), cell("unscaled", 120, False)]) == ["no"]
    assert verdicts([cell("scaled", 600, True), cell("unscaled", 600, True)]) == ["confounded"]


def test_predicted_score_std_follows_the_variance_argument():
    model = {"d_model": 64, "n_heads": 1, "init": "unit_variance", "attention": {"d_k": 256, "scale": "none"}}
    assert abs(predicted_score_std(model) - 16.0) < 1e-9
    model["attention"]["scale"] = "sqrt_dk"
    assert abs(predicted_score_std(model) - 1.0) < 1e-9
