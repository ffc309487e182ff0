import pytest
from tiny_lm import build


@pytest.mark.attention_doctor(baseline="attention_baseline.json")
def test_model():
    return build()
