#!/usr/bin/env python3
"""Loads a `ptrain export --format hf` directory with transformers and compares its logits with
the ones ptrain wrote for the same window (`ptrain eval --dump-logits`).

  scripts/hf_logits.py MODEL_DIR LOGITS_JSON TOLERANCE

Fails when loading reports missing, unexpected or mismatched keys, or when the largest absolute
logit difference is above TOLERANCE. Prints that difference either way."""
import json
import sys

import torch
from transformers import AutoModelForCausalLM

model_dir, dump_path, tolerance = sys.argv[1], sys.argv[2], float(sys.argv[3])
model, info = AutoModelForCausalLM.from_pretrained(
    model_dir, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
dump = json.load(open(dump_path))
with torch.no_grad():
    theirs = model(torch.tensor([dump["tokens"]])).logits[0].double()
ours = torch.tensor(dump["logits"], dtype=torch.float64)
difference = (theirs - ours).abs().max().item()
print(f"{model_dir}: {type(model).__name__}, {len(dump['tokens'])} positions x {ours.shape[1]} logits, "
      f"largest |transformers - ptrain| = {difference:.3e} (tolerance {tolerance:g}); loading info {problems or 'clean'}")
sys.exit(0 if difference <= tolerance and not problems else 1)
