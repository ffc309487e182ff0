"""The model kinds the zoo builds: each one of transformers' auto mappings (model type -> class)
and the auto class that builds it from a config. A model type in several mappings (Gemma3 is a
causal LM and an image-text-to-text model) is built as the first kind here that maps it. The
default run examines the causal LMs; `--kind` names others (a release that lacks a mapping has
none of that kind)."""
KINDS = {   # kind: (the mapping's name in transformers.models.auto.modeling_auto, its auto class)
    "causal_lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "seq2seq_lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    "image_text_to_text": ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "AutoModelForImageTextToText"),
    "vision_to_seq": ("MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", "AutoModelForVision2Seq"),   # 4.4x's image-text models
}
DEFAULT = ("causal_lm",)


def mapping(kind: str) -> dict:
    """model type -> class name of one kind in the installed transformers ({} where it has none)."""
    from transformers.models.auto import modeling_auto
    return dict(getattr(modeling_auto, KINDS[kind][0], {}))


def of(arch: str, prefer=()) -> tuple[str, str, str] | None:
    """(kind, class name, auto class name) the zoo builds `arch` as: the first of the kinds `prefer`,
    then of KINDS, that maps it (BART is a causal LM and a seq2seq LM); None where none maps it."""
    for kind in [*prefer, *KINDS]:
        auto = KINDS[kind][1]
        cls = mapping(kind).get(arch)
        if cls:
            return kind, cls, auto
    return None


def every(kinds=DEFAULT) -> list[str]:
    """The model types of `kinds`, each once, in the kinds' order."""
    out = {}
    for k in kinds:
        out.update(dict.fromkeys(a for a in mapping(k) if of(a, kinds)[0] == k))
    return list(out)
