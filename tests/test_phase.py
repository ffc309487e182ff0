"""The phase section's judgement: unscaled against its scaled twin."""
from attention.variance import predicted_score_std
from experiments.report.sections.phase import model_score_std, pairs_table


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
    model = {"d_model": 64, "n_heads": 1, "init": "unit_variance", "qk_gain": 1.0,
             "attention": {"d_k": 256, "scale": "none", "score": "dot"}}
    assert abs(model_score_std(model) - 16.0) < 1e-9
    model["attention"]["scale"] = "sqrt_dk"
    assert abs(model_score_std(model) - 1.0) < 1e-9
    assert abs(predicted_score_std("gpt2", 64, 16, 2.0, "none") - 4 * (0.02 * 2) ** 2 * 64) < 1e-12


def test_learned_scale_starts_where_the_layer_starts_it():
    """The report's prediction and the layer agree, cosine included (learned: sqrt(d_k) there)."""
    import math

    from attention import MultiHeadAttention
    for score in ("dot", "cosine"):
        m = MultiHeadAttention(d_model=32, n_heads=2, score=score, scale="learned")
        assert math.isclose(float(m.scale_factor()[0].detach()), predicted_score_std("gpt2", 32, 16, 1.0, "learned", score)
                            / predicted_score_std("gpt2", 32, 16, 1.0, "none", score), rel_tol=1e-6)
