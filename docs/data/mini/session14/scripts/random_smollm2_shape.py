# A random model of SmolLM2-135M-Instruct's shape (bf16) with a word-level tokenizer, for
# benchmarks/generation_speed.py: decoding cost per step depends on the shape, not the weights.
import sys

import tokenizers
import torch
import transformers

path = sys.argv[1]
specials = ["<|end|>", "<|user|>", "<|assistant|>", "<unk>"]
tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
tok.train_from_iterator(["Write a Triton kernel for this chain ."],
                        tokenizers.trainers.WordLevelTrainer(special_tokens=specials))
fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", unk_token="<unk>",
                                            pad_token="<|end|>")
fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|> {% endif %}")
fast.save_pretrained(path)
config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                  tie_word_embeddings=True, eos_token_id=fast.eos_token_id,
                                  pad_token_id=fast.pad_token_id)
torch.manual_seed(0)
transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)
print("saved", path)
