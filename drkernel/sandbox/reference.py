"""The reference, loaded and built in the judge: what every phase computes the expected answers with.

It is the judge's own: the candidate's process never holds it. Its inputs come from seeds only the judge knows; its
float64 copy is made when the precision rule first needs it; its sizes on the meta device tell whether the
evaluation is large (drkernel.sandbox.gpu_policy).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from drkernel.sandbox import correctness, loading
from drkernel.sandbox.loading import seeded, trimmed_traceback
from drkernel.sandbox.verdict import Failure
from drkernel.schema import ErrorKind, EvalOptions, Status


@dataclass
class Reference:
    model: torch.nn.Module
    call: Callable[..., Any]
    get_inputs: Callable[[], Any]
    init_inputs: list[Any]
    device: torch.device
    sizes: tuple[int | None, int | None] = (None, None)  # bytes of its inputs and outputs (`sizes_on_meta`)
    _exact: torch.nn.Module | None = None  # the float64 copy, made when first needed

    def inputs(self, seed: int) -> list[Any]:
        try:
            values = seeded(seed, self.device, self.get_inputs)
        except BaseException as exc:
            raise Failure(Status.INVALID, ErrorKind.REFERENCE_ERROR, f"get_inputs() failed: {exc}")
        return [v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values]

    def exact(self, inputs: list[Any], training: bool) -> Any:
        """The reference's outputs computed in float64 (parameters, buffers and floating inputs upcast)."""
        if self._exact is None:
            self._exact = copy.deepcopy(self.model).double()
        self._exact.train(training)
        upcast = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in inputs]
        return self._exact(*upcast)


def load_reference(source: str, options: EvalOptions, workdir: Path, device: torch.device,
                   with_sizes: bool) -> Reference:
    """The reference built from `source` (`with_sizes`: its sizes estimated on the meta device too)."""
    try:
        module = loading.load_module(source, workdir / "reference.py", f"drkernel_reference_{os.getpid()}")
        loading.require(module, ("Model", "get_inputs", "get_init_inputs"), "reference")
        init_inputs = list(seeded(options.seed, device, module.get_init_inputs))
        model = seeded(options.seed, device, lambda: module.Model(*init_inputs)).to(device)
    except BaseException as exc:
        raise Failure(Status.INVALID, ErrorKind.REFERENCE_ERROR, f"the reference is unusable: {exc}",
                      trimmed_traceback(exc, workdir))
    call = torch.compile(model) if options.reference_mode == "compile" else model
    return Reference(model=model, call=call, get_inputs=module.get_inputs, init_inputs=init_inputs, device=device,
                     sizes=sizes_on_meta(module) if with_sizes else (None, None))


def sizes_on_meta(module: Any) -> tuple[int | None, int | None]:
    """Bytes of the tensors the reference's `get_inputs` makes and of its outputs for them, from a model built and run
    on the meta device (nothing is allocated); None for what cannot be known without running it for real."""
    try:
        with torch.device("meta"):
            inputs = module.get_inputs()
    except Exception:
        return None, None
    try:
        with torch.device("meta"), torch.no_grad():
            outputs = module.Model(*module.get_init_inputs())(*inputs)
    except Exception:
        outputs = None
    return correctness.tensor_bytes(inputs), None if outputs is None else correctness.tensor_bytes(outputs)


def detached(out: Any) -> Any:
    """A forward's outputs without their autograd graph: in a grad mode it holds what the forward saved for a
    backward that never comes (inputs a weight's gradient needs, activations) as long as the outputs live."""
    return torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out)
