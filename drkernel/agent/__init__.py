"""The agent loop: a model writes a kernel, KernelGym judges it, the model refines it.

Pure pieces (prompts, parsing, context policies, records) import nothing heavy; the model backends, the evaluator
adapters and the loop build on them. `drkernel bench` and the trainer run the same loop.
"""
