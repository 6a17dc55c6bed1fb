# expected: correct
# task: 5_layernorm
# The kernel wrapped in a torch.autograd.Function (as real training code does); the backward is not exercised by the
# evaluation but the forward runs through Function.apply in every mode, grad-enabled ones included.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, rstd_ptr, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    diff = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride + cols, diff * rstd * w + b, mask=mask)


class TritonLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x2 = x.reshape(-1, weight.numel()).contiguous()
        out = torch.empty_like(x2)
        rstd = torch.empty(x2.shape[0], device=x.device, dtype=torch.float32)
        layernorm_kernel[(x2.shape[0],)](x2, weight, bias, out, rstd, weight.numel(), x2.stride(0), eps,
                                         BLOCK=triton.next_power_of_2(weight.numel()))
        ctx.save_for_backward(x2, weight, rstd)
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad):  # not needed by the evaluation
        raise NotImplementedError


class ModelNew(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        with torch.no_grad():
            self.weight.normal_(1.0, 0.5)
            self.bias.normal_(0.0, 0.5)

    def forward(self, x):
        return TritonLayerNorm.apply(x, self.weight, self.bias, self.eps)
