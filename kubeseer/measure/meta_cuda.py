"""Run a CUDA job's step on the meta device with the CUDA behaviours meta lacks.

Meta tensors have shapes, dtypes and storages but no data, and autograd runs on them, so a
training step (forward, backward, optimiser) of any size runs on a machine without a GPU in
seconds. Fake CUDA tensors would be closer, but with torch 2.13 the autograd engine asks the
driver for a primary context before a CUDA backward, so they cannot train. Two things a GPU
does differently from meta are supplied here, as a `TorchFunctionMode` (above autograd,
where PyTorch's own autocast sits, so casts are recorded by autograd as they are on a GPU):

* **Autocast** (`torch.autocast("cuda", dtype)`): PyTorch's CUDA policy
  (`aten/src/ATen/autocast_mode.cpp`): matmuls, convolutions, linear and attention run in the
  lower precision; reductions, normalisations, losses, exponentials and upsampling in FP32;
  softmax, log-softmax, sum, cumsum and prod run with an FP32 output; a few ops promote to the
  widest input type. FP32 leaf tensors that require grad (the weights) are cast once per
  autocast region and the copy is cached, as autocast's weight cache does. The policy applies
  to the outermost function call this mode sees; the tests check that the result matches
  PyTorch's own CUDA autocast on fake CUDA tensors, operator for operator, on real models.
* **Scaled-dot-product attention**: which kernel `F.scaled_dot_product_attention` runs decides
  whether a sequence-by-sequence matrix exists. On a GPU PyTorch prefers FlashAttention-2 (FP16
  or BF16, no explicit mask, head dim at most 256), then the memory-efficient kernel (any float
  dtype, masks allowed), then the math path, which materialises the scores. `attention="auto"`
  follows that order (assuming an SM80+ GPU); `"flash"`, `"efficient"` or `"math"` force one, as
  a DLJob may.
* **Dropout in training**: out of place and with ``0 < p < 1``, CUDA runs ATen's fused kernel
  (``native_dropout``, Dropout.cpp's ``is_fused_kernel_acceptable``), which keeps a one-byte
  mask for backward; every other device, meta included, multiplies by a noise tensor of the
  input's dtype and keeps that. A zoo GPT's training step (fp16, batch 2, 2,048 tokens) was
  derived 24.4 GB with the noise tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

__all__ = ["ATTENTION_KERNELS", "AttentionKernel", "CudaSemantics"]

AttentionKernel = Literal["auto", "flash", "efficient", "math"]
ATTENTION_KERNELS: Final[tuple[str, ...]] = ("auto", "flash", "efficient", "math")

# CUDA autocast's lists, by ATen operator name (autocast_mode.cpp, torch 2.x).
LOWER_PRECISION: Final = frozenset(
    {
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "convolution", "prelu", "addmm", "addmv",
        "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm",
        "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell",
        "rnn_relu_cell", "scaled_dot_product_attention", "__matmul__", "__rmatmul__",
    }
)  # fmt: skip
FP32: Final = frozenset(
    {
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus",
        "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm", "nuclear_norm",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
        "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
        "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
        "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
        "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
        "upsample_trilinear3d", "upsample_bilinear2d", "upsample_linear1d",
        "upsample_bicubic2d", "interpolate", "normalize", "rms_norm",
    }
)  # fmt: skip
FP32_OUTPUT: Final = frozenset(
    {"softmax", "log_softmax", "cumprod", "cumsum", "prod", "sum", "linalg_vector_norm",
     "linalg_matrix_norm"}
)  # fmt: skip
PROMOTE: Final = frozenset(
    {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
     "index_put", "tensordot", "scatter_add", "cat", "stack"}
)  # fmt: skip
# Losses that PyTorch runs as log-softmax (FP32 output) then an FP32 NLL under autocast.
_CROSS_ENTROPY: Final = frozenset({"cross_entropy", "cross_entropy_loss"})

_FLASH_MAX_HEAD_DIM: Final = 256

# (Log-)softmax with an FP32 output reads FP16 directly on a GPU (ATen's ``half_to_float``
# kernel, SoftMax.cpp), where any other device, meta included, first makes an FP32 copy of the
# input; bf16 is copied on a GPU too.
_HALF_TO_FLOAT: Final = {
    "softmax": torch.ops.aten._softmax,
    "log_softmax": torch.ops.aten._log_softmax,
}


def _dropout(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`func` (``F.dropout`` or ``torch.dropout``) as CUDA runs it: out of place in training
    with ``0 < p < 1``, the fused kernel and its one-byte mask."""
    values = dict(zip(("input", "p", "training", "inplace"), args, strict=False)) | kwargs
    x, p = values.get("input"), float(values.get("p", 0.5))
    training = bool(values.get("training", values.get("train", True)))
    in_place = bool(values.get("inplace", False)) or getattr(func, "__name__", "").endswith("_")
    if (
        isinstance(x, torch.Tensor)
        and x.is_floating_point()
        and x.numel() > 0
        and training
        and not in_place
        and 0.0 < p < 1.0
    ):
        return torch.native_dropout(x, p, True)[0]
    return func(*args, **kwargs)


def _softmax_to_float(
    func: Callable[..., Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """`func` (softmax or log-softmax) as CUDA runs it: an FP16 input with an FP32 output goes
    through the ``half_to_float`` kernel, which makes no FP32 copy of the input."""
    values = dict(zip(("input", "dim"), args, strict=False)) | kwargs
    x, dim = values.get("input"), values.get("dim")
    if (
        isinstance(x, torch.Tensor)
        and x.dtype == torch.float16
        and values.get("dtype") == torch.float32
        and isinstance(dim, int)
    ):
        return _HALF_TO_FLOAT[name](x, dim, True)
    return func(*args, **kwargs)


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", "").removesuffix("_")


def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


class CudaSemantics(TorchFunctionMode):
    """Autocast to `dtype` (None: no autocast) and the GPU's attention kernel, on meta tensors.

    Args:
        dtype: `torch.float16`, `torch.bfloat16`, or None for FP32 jobs.
        attention: which scaled-dot-product-attention kernel runs (see the module docstring).

    Enter it around the forward pass (and the loss) exactly where the job enters
    `torch.autocast`; leaving it drops the weight-cast cache.
    """

    def __init__(self, dtype: torch.dtype | None, attention: AttentionKernel = "auto") -> None:
        super().__init__()
        if attention not in ATTENTION_KERNELS:
            raise ValueError(f"attention must be one of {ATTENTION_KERNELS}, got {attention!r}")
        self.dtype = dtype
        self.attention = attention
        self._cache: dict[int, torch.Tensor] = {}

    def __exit__(self, *exc: object) -> None:
        self._cache.clear()
        super().__exit__(*exc)  # type: ignore[no-untyped-call]  # untyped in torch

    def _cast(self, value: Any, to: torch.dtype, *, from_lower_only: bool) -> Any:
        if not _is_float(value) or value.dtype in (to, torch.float64):
            return value
        if from_lower_only and value.dtype == torch.float32:
            return value
        cacheable = (
            to == self.dtype
            and value.dtype == torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
            # PyTorch's autocast keeps no weight-cast cache under inference mode (measured
            # against it on fake CUDA tensors: the copies are freed after each use there).
            and not torch.is_inference_mode_enabled()
        )
        if cacheable:
            cached = self._cache.get(id(value))
            if cached is None:
                cached = value.to(to)
                self._cache[id(value)] = cached
            return cached
        return value.to(to)

    def _cast_all(self, args: Any, kwargs: Any, to: torch.dtype, *, lower: bool) -> Any:
        def cast(value: Any) -> Any:
            return self._cast(value, to, from_lower_only=lower)

        return tree_map(cast, args), tree_map(cast, kwargs)

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        name = _name(func)
        if self.dtype is not None:
            args, kwargs = self._apply_autocast(func, name, args, kwargs)
            if name in _CROSS_ENTROPY:
                return self._cross_entropy(*args, **kwargs)
            if name in _HALF_TO_FLOAT:
                return _softmax_to_float(func, name, args, kwargs)
        if name == "scaled_dot_product_attention":
            return self._attention(func, *args, **kwargs)
        if name == "dropout":
            return _dropout(func, args, kwargs)
        return func(*args, **kwargs)

    def _apply_autocast(
        self, func: Callable[..., Any], name: str, args: Any, kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        assert self.dtype is not None
        if name in LOWER_PRECISION:
            return self._cast_all(args, kwargs, self.dtype, lower=False)  # type: ignore[no-any-return]
        if name in FP32:
            return self._cast_all(args, kwargs, torch.float32, lower=True)  # type: ignore[no-any-return]
        if name in FP32_OUTPUT and kwargs.get("dtype") is None and any(map(_is_float, args)):
            # Autocast runs these with dtype=float32 unless the caller set one.
            kwargs["dtype"] = torch.float32
            return args, kwargs
        if name in PROMOTE:
            floats = [a for a in tree_map_only_tensors(args) if a.is_floating_point()]
            if floats:
                widest = (
                    torch.float32
                    if any(a.dtype == torch.float32 for a in floats)
                    else floats[0].dtype
                )
                return self._cast_all(args, kwargs, widest, lower=True)  # type: ignore[no-any-return]
        return args, kwargs

    def _cross_entropy(
        self, logits: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        from torch.nn import functional

        # cross_entropy is composite: under CUDA autocast its log_softmax writes FP32 straight
        # from the low-precision logits (no FP32 copy of them), then nll_loss runs in FP32.
        if kwargs.get("label_smoothing", 0.0) or (args and len(args) >= 5 and args[4]):
            return functional.cross_entropy(logits.float(), target, *args, **kwargs)
        dim = 1 if logits.dim() > 1 else 0
        log_probs = _softmax_to_float(
            torch.log_softmax, "log_softmax", (logits, dim), {"dtype": torch.float32}
        )
        keep = {k: v for k, v in kwargs.items() if k in ("weight", "ignore_index", "reduction")}
        return functional.nll_loss(log_probs, target, **keep)

    def _attention(
        self,
        func: Callable[..., Any],
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        kernel = self._attention_kernel(query, key, value, attn_mask, enable_gqa)
        if kernel == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )[0]
        if kernel == "efficient":
            grad = query.requires_grad or key.requires_grad or value.requires_grad
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:
                bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill(~bias, float("-inf"))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, grad and torch.is_grad_enabled(), dropout_p, is_causal,
                scale=scale,
            )[0]  # fmt: skip
        return func(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa,
        )  # fmt: skip

    def _attention_kernel(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        enable_gqa: bool,
    ) -> str:
        if self.attention != "auto":
            return self.attention
        same_heads = query.shape[:-2] == key.shape[:-2] == value.shape[:-2] and not enable_gqa
        head_dim = query.shape[-1]
        four_d = query.dim() == 4
        if (
            four_d
            and same_heads
            and query.dtype in (torch.float16, torch.bfloat16)
            and attn_mask is None
            and head_dim <= _FLASH_MAX_HEAD_DIM
            and head_dim % 8 == 0
            and value.shape[-1] == head_dim
        ):
            return "flash"
        if four_d and same_heads and head_dim % (8 if query.dtype != torch.float32 else 4) == 0:
            return "efficient"
        return "math"


def tree_map_only_tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure of arguments."""
    from torch.utils._pytree import tree_flatten

    return [value for value in tree_flatten(tree)[0] if isinstance(value, torch.Tensor)]
