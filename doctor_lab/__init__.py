"""Test subjects for the attention doctor: causal LMs written in other projects' styles, healthy and with planted bugs."""
