"""rmsnorm.torch - the library for CPU torch tensors, as torch ops (docs/python.md).

Importing it registers the ops torch.ops.rmsnorm.* (rmsnorm._torch, compiled by the first
import against the running torch; fake kernels in rmsnorm._torch_fake), which work under
autograd (any order), torch.compile(fullgraph=True), torch.export, fake and meta tensors.
The functions (rmsnorm.torch.functions) call those ops; the modules (rmsnorm.torch.modules)
RMSNorm, LayerNorm, LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm and the gated RMSNormGated
(MambaRMSNormGated, Qwen3NextRMSNormGated) replace torch's and transformers', and
patch(model) (rmsnorm.torch.patching) swaps a model's norms for them in place, and on request
fuses Gemma 2/3's sandwich norms and the attentions' QK-norm + RoPE. Calls run on up to
torch.get_num_threads() threads (read on each call); results do not depend on it. Sharded
rows: rmsnorm.torch.distributed.
"""

import torch

from . import functions as _functions
from .functions import *  # noqa: F401,F403
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all
from .patching import patch

__all__ = _functions.__all__ + _modules_all + ["patch"]

_ops = torch.ops.rmsnorm

from . import onnx as _onnx  # noqa: E402,F401  (ONNX export: registers translations lazily)
