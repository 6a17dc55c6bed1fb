"""Greedy and sampled fused answers of the SFT policy, the kernel's name forced to fused_kernel: is a fused answer
wrong because of the policy or because of sampling at temperature 1?"""
import json, sys, torch
from pathlib import Path
from drkernel.agent.local_models import load_causal_lm, load_tokenizer
from drkernel.agent.prompts import first_turn_prompt
from drkernel.agent.parsing import extract_code
from drkernel.tasks.loaders import load_task_dir
path, tasks_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
n = int(sys.argv[4])
tok = load_tokenizer(path, padding_side="left"); tok.pad_token = tok.pad_token or tok.eos_token
model = load_causal_lm(path, dtype=torch.float32).eval()
tasks = sorted(load_task_dir(tasks_dir), key=lambda t: t.problem_id)[:n]
prefix = ("Here is the optimized model.\n\n```python\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
          "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef fused_kernel")
texts = [tok.apply_chat_template([{"role": "user", "content": first_turn_prompt(t.code)}], add_generation_prompt=True,
                                 tokenize=False) + prefix for t in tasks]
batch = tok(texts, return_tensors="pt", padding=True)
rows = []
for mode in ("greedy", "t1"):
    torch.manual_seed(0)
    with torch.no_grad():
        gen = model.generate(**batch, max_new_tokens=420, do_sample=mode == "t1", temperature=1.0 if mode == "t1" else None,
                             top_p=0.95 if mode == "t1" else None, pad_token_id=tok.pad_token_id)
    for t, g in zip(tasks, gen[:, batch["input_ids"].shape[1]:]):
        text = prefix + tok.decode(g, skip_special_tokens=True)
        rows.append({"task": t.name, "mode": mode, "code": extract_code(text)})
out.write_text("".join(json.dumps(r) + "\n" for r in rows))
print("wrote", len(rows))
