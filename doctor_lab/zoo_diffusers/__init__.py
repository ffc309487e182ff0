"""The diffusers zoo: every attention processor class of diffusers.models.attention_processor in a
small module that holds it (attention_doctor/diffusers.py: PROCESSORS says how each is driven, or
why it cannot run here), self- and cross-attention, examined by the attention doctor
(`python -m doctor_lab.zoo_diffusers`)."""
