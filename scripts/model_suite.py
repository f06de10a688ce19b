#!/usr/bin/env python3
"""The real-model suite: architectures from torchvision, timm and transformers (their own code, random weights,
nothing downloaded), exported by PyTorch's two ONNX exporters, and checked through xpuruntime against PyTorch's
own output (docs/model_suite.md).

Two commands::

    # export (needs torch; transformers and timm for those families): models, inputs and PyTorch's references
    python3 scripts/model_suite.py export --tiny --out models/suite/tiny
    # run every exported model through InferenceSession and compare with PyTorch (numpy and xpuruntime only)
    python3 scripts/model_suite.py run --device cpu --tiny

``export`` writes, per architecture ``NAME``: ``NAME.dynamo.float32.onnx`` (``torch.onnx.export(..., dynamo=True)``,
opset 18), ``NAME.torchscript.float32.onnx`` (``dynamo=False``, opset 17), the same two in float16, and
``NAME.npz``: the test inputs (at a batch and sequence length other than the export's, so the symbolic dimensions
are exercised), PyTorch's float64 reference outputs, and PyTorch's own float32 and float16 errors against that
reference, from which the run derives its tolerances. ``manifest.json`` lists what was exported and what failed.

``run`` prints one line per model and ends with ``N passed, M failed``; its exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY_DIR = ROOT / "models" / "suite" / "tiny"
EXPORTERS = ("dynamo", "torchscript")
DTYPES = ("float32", "float16")
OPSET = {"dynamo": 18, "torchscript": 17}
# Test shapes differ from the export's (batch 2, sequence 8) so that symbolic dimensions are exercised.
EXPORT_BATCH, EXPORT_SEQ = 2, 8
TEST_BATCH, TEST_SEQ = 3, 11
# Tolerance: a model's error may be this many times PyTorch's own error in the same precision, plus a floor
# relative to the output's magnitude (PyTorch's float32 error can be 0 on a tiny model).
ERROR_FACTOR = 8.0
FLOOR = {"float32": 1e-4, "float16": 2e-2}


# ----------------------------------------------------------------------------------------------------------------
# Architectures (need torch; imported lazily so that `run` works with numpy alone)
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Built:
    module: "object"
    inputs: Dict[str, "object"]  # name -> example tensor (export shapes)
    test_inputs: Dict[str, "object"]  # name -> tensor at the test shapes
    dynamic: Dict[str, Dict[int, str]]  # input name -> {axis: symbol}
    outputs: List[str]
    # data-dependent outputs (detections): compared as sets of rows, and in float16 only their count is bounded
    data_dependent: bool = False
    max_seq: int = 64  # the sequence dimension's upper bound (torch.export needs one for position embeddings)


@dataclass
class Arch:
    name: str
    family: str
    library: str
    build: Callable[[bool], Built]
    notes: str = ""


class _Tuple:
    """Wraps a model so it returns a tuple of tensors (transformers' ModelOutput, torchvision's dicts)."""

    @staticmethod
    def wrap(module, pick, names=None):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = module

            # Explicit parameters (not *args): torch.export matches dynamic_shapes to them one by one.
            def forward(self, x0, x1=None, x2=None):
                args = [a for a in (x0, x1, x2) if a is not None]
                out = self.inner(**dict(zip(names, args))) if names else self.inner(*args)
                return pick(out)

        return Wrapped().eval()


def _image(batch, size, channels=3):
    import torch

    return torch.randn(batch, channels, size, size)


def _vision(module, size, channels=3, pick=None) -> Built:
    import torch

    torch.manual_seed(1)
    m = _Tuple.wrap(module, pick) if pick else module.eval()
    return Built(m, {"pixel_values": _image(EXPORT_BATCH, size, channels)},
                 {"pixel_values": _image(TEST_BATCH, size, channels)}, {"pixel_values": {0: "batch"}}, ["output"])


def _text(module, vocab, pick, mask=True, names=("input_ids", "attention_mask"), max_seq=None) -> Built:
    import torch

    max_seq = max_seq or getattr(module.config, "max_position_embeddings", None) or 512

    torch.manual_seed(1)

    def feeds(batch, seq):
        ids = torch.randint(0, vocab, (batch, seq), dtype=torch.int64)
        out = {names[0]: ids}
        if mask:
            m = torch.ones(batch, seq, dtype=torch.int64)
            m[0, seq - 2:] = 0  # one padded row: the mask arithmetic matters
            out[names[1]] = m
        return out

    ins = feeds(EXPORT_BATCH, EXPORT_SEQ)
    dyn = {n: {0: "batch", 1: "sequence"} for n in ins}
    return Built(_Tuple.wrap(module, pick, list(ins)), ins, feeds(TEST_BATCH, TEST_SEQ), dyn, ["last_hidden_state"],
                 max_seq=max_seq)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state


# -- CNNs (torchvision, timm) --

def build_resnet(tiny):
    if not tiny:
        import torchvision
        return _vision(torchvision.models.resnet50(), 224)
    from timm.models.resnet import ResNet, BasicBlock
    return _vision(ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, channels=(8, 16, 32, 64), stem_width=8), 32)


def build_mobilenet_v2(tiny):
    import torchvision
    setting = [[1, 8, 1, 1], [6, 16, 2, 2], [6, 24, 2, 2], [6, 32, 1, 1]]  # t, c, n, s
    m = (torchvision.models.mobilenet_v2(num_classes=10, inverted_residual_setting=setting) if tiny
         else torchvision.models.mobilenet_v2())
    return _vision(m, 32 if tiny else 224)


def build_mobilenet_v3(tiny):
    import torchvision
    m = (torchvision.models.mobilenet_v3_small(width_mult=0.25, num_classes=10) if tiny
         else torchvision.models.mobilenet_v3_large())
    return _vision(m, 32 if tiny else 224)


def build_efficientnet(tiny):
    import torchvision
    from torchvision.models import efficientnet as en
    if not tiny:
        return _vision(torchvision.models.efficientnet_b0(), 224)
    setting, last = en._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return _vision(en.EfficientNet(setting, 0.2, num_classes=10, last_channel=last), 32)


def build_regnet(tiny):
    import torchvision
    from torchvision.models import regnet as rn
    if not tiny:
        return _vision(torchvision.models.regnet_y_400mf(), 224)
    params = rn.BlockParams.from_init_params(depth=3, w_0=8, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return _vision(rn.RegNet(params, num_classes=10, stem_width=8), 32)


def build_convnext(tiny):
    import torchvision
    from torchvision.models import convnext as cn
    if not tiny:
        return _vision(torchvision.models.convnext_tiny(), 224)
    setting = [cn.CNBlockConfig(16, 32, 1), cn.CNBlockConfig(32, 64, 1), cn.CNBlockConfig(64, None, 1)]
    return _vision(cn.ConvNeXt(setting, num_classes=10), 32)


def build_densenet(tiny):
    import torchvision
    from torchvision.models import densenet as dn
    if not tiny:
        return _vision(torchvision.models.densenet121(), 224)
    return _vision(dn.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=10),
                   32)


def _tiny_segmentation_backbone():
    """A dilated MobileNetV3 (width 0.25) up to its last block of at most 40 channels, and that block's channels."""
    import torchvision
    from torchvision.models._utils import IntermediateLayerGetter
    features = torchvision.models.mobilenet_v3_large(width_mult=0.25, dilated=True).features
    last = max(i for i, f in enumerate(features) if getattr(f, "out_channels", 99) <= 40)
    return IntermediateLayerGetter(features, {str(last): "out"}), features[last].out_channels


def build_fcn(tiny):
    """Semantic segmentation: torchvision's FCN (bilinear Resize back to the input size) on a MobileNetV3."""
    import torchvision
    from torchvision.models.segmentation.fcn import FCN, FCNHead
    if not tiny:
        return _vision(torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights_backbone=None,
                                                                                num_classes=21), 224,
                       pick=lambda o: o["out"])
    backbone, channels = _tiny_segmentation_backbone()
    return _vision(FCN(backbone, FCNHead(channels, 5)), 32, pick=lambda o: o["out"])


def build_ssdlite(tiny):
    """Detection with post-processing: torchvision's SSDlite (anchors, box decoding, batched NMS, TopK)."""
    import torch
    import torchvision
    from torchvision.models.detection import ssdlite
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
    from functools import partial
    if tiny:
        norm = partial(torch.nn.BatchNorm2d, eps=0.001, momentum=0.03)
        backbone = torchvision.models.mobilenet_v3_large(norm_layer=norm, width_mult=0.25, reduced_tail=True)
        backbone = ssdlite._mobilenet_extractor(backbone, 6, norm)
        size = (64, 64)
        anchors = DefaultBoxGenerator([[2, 3] for _ in range(6)], min_ratio=0.2, max_ratio=0.95)
        out_channels = torchvision.models.detection._utils.retrieve_out_channels(backbone, size)
        head = ssdlite.SSDLiteHead(out_channels, anchors.num_anchors_per_location(), 4, norm)
        model = ssdlite.SSD(backbone, anchors, size, 4, head=head, score_thresh=0.001, nms_thresh=0.55,
                            detections_per_img=20, topk_candidates=50,
                            image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.25, 0.25])
        side = 64
    else:
        model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
        side = 320
    model.eval()
    torch.manual_seed(1)

    class Detector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, images):
            det = self.model(list(images))[0]  # one image: detections of data-dependent count
            return det["boxes"], det["scores"], det["labels"]

    img = lambda: torch.rand(1, 3, side, side)  # noqa: E731
    return Built(Detector().eval(), {"images": img()}, {"images": img()}, {}, ["boxes", "scores", "labels"],
                 data_dependent=True)


# -- vision transformers (timm, transformers) --

def build_vit(tiny):
    from timm.models.vision_transformer import VisionTransformer
    if not tiny:
        return _vision(VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12), 224)
    return _vision(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2,
                                     num_classes=10), 32)


def build_deit(tiny):
    from transformers import DeiTConfig, DeiTModel
    cfg = (DeiTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64) if tiny else DeiTConfig(hidden_size=384, num_attention_heads=6,
                                                                    intermediate_size=1536))
    return _vision(DeiTModel(cfg, add_pooling_layer=False), 32 if tiny else 224, pick=_first)


def build_beit(tiny):
    from transformers import BeitConfig, BeitModel
    cfg = (BeitConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, use_relative_position_bias=True, vocab_size=64) if tiny
           else BeitConfig(use_relative_position_bias=True))
    return _vision(BeitModel(cfg, add_pooling_layer=False), 32 if tiny else 224, pick=_first)


def build_swin(tiny):
    from timm.models.swin_transformer import SwinTransformer
    if not tiny:
        return _vision(SwinTransformer(img_size=224, patch_size=4, window_size=7, embed_dim=96, depths=(2, 2, 6, 2),
                                       num_heads=(3, 6, 12, 24)), 224)
    return _vision(SwinTransformer(img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1),
                                   num_heads=(2, 4), num_classes=10), 32)


# -- text encoders and decoders (transformers) --

def build_bert(tiny):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64) if tiny else BertConfig()
    return _text(BertModel(cfg, add_pooling_layer=False).eval(), cfg.vocab_size, _first)


def build_distilbert(tiny):
    from transformers import DistilBertConfig, DistilBertModel
    cfg = DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                           max_position_embeddings=64) if tiny else DistilBertConfig()
    return _text(DistilBertModel(cfg).eval(), cfg.vocab_size, _first)


def build_roberta(tiny):
    from transformers import RobertaConfig, RobertaModel
    cfg = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=66) if tiny else RobertaConfig()
    # RoBERTa's positions start after the padding index: two fewer than max_position_embeddings
    return _text(RobertaModel(cfg, add_pooling_layer=False).eval(), cfg.vocab_size, _first,
                 max_seq=cfg.max_position_embeddings - 2)


def build_t5_encoder(tiny):
    from transformers import T5Config, T5EncoderModel
    cfg = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4) if tiny \
        else T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8)
    return _text(T5EncoderModel(cfg).eval(), cfg.vocab_size, _first)


def build_gpt2(tiny):
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False) if tiny \
        else GPT2Config(use_cache=False)
    return _text(GPT2Model(cfg).eval(), cfg.vocab_size, _first)


def build_llama(tiny):
    """A Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU; no KV cache."""
    from transformers import LlamaConfig, LlamaModel
    cfg = (LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
           if tiny else LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                    num_attention_heads=16, num_key_value_heads=4, use_cache=False))
    return _text(LlamaModel(cfg).eval(), cfg.vocab_size, _first)


def build_whisper_encoder(tiny):
    """An audio encoder: Whisper's (two Conv1d, then a transformer), log-mel features of a fixed length."""
    import torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    cfg = (WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                         num_mel_bins=16, max_source_positions=16) if tiny
           else WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048))
    torch.manual_seed(1)
    frames = 2 * cfg.max_source_positions
    m = _Tuple.wrap(WhisperEncoder(cfg).eval(), _first)
    feats = lambda b: torch.randn(b, cfg.num_mel_bins, frames)  # noqa: E731
    return Built(m, {"input_features": feats(EXPORT_BATCH)}, {"input_features": feats(TEST_BATCH)},
                 {"input_features": {0: "batch"}}, ["last_hidden_state"])


def build_clip_text(tiny):
    from transformers import CLIPTextConfig, CLIPTextModel
    cfg = CLIPTextConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=32) if tiny else CLIPTextConfig()
    return _text(CLIPTextModel(cfg).eval(), cfg.vocab_size, _first)


def build_clip_vision(tiny):
    from transformers import CLIPVisionConfig, CLIPVisionModel
    cfg = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8) if tiny else CLIPVisionConfig(patch_size=32)
    return _vision(CLIPVisionModel(cfg).eval(), 32 if tiny else 224, pick=_first)


# -- added for issue 42: the patterns the suite had not shown (grouped convolutions, Inception branches, channel
# shuffles, fused MBConv, multi-axis and continuous-position windows, atrous pyramids, disentangled attention, fused
# QKV and gate/up decoders, parallel residuals, spatial-reduction attention, audio convolutions with group norm,
# interpolated position embeddings, unfolded patches, global response norm) --

def build_resnext(tiny):
    """Grouped 3x3 convolutions in bottlenecks (ResNeXt)."""
    if not tiny:
        import torchvision
        return _vision(torchvision.models.resnext50_32x4d(), 224)
    from timm.models.resnet import ResNet, Bottleneck
    return _vision(ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, channels=(8, 16, 32, 64), stem_width=8,
                          cardinality=4, base_width=32), 32)


def build_inception(tiny):
    """GoogLeNet's Inception blocks: four parallel branches (1x1, 3x3, 5x5 as 3x3, pooled) concatenated."""
    import torch
    import torchvision
    if not tiny:
        return _vision(torchvision.models.googlenet(aux_logits=False, init_weights=True), 224)
    from torchvision.models.googlenet import BasicConv2d, Inception
    net = torch.nn.Sequential(BasicConv2d(3, 16, kernel_size=3, stride=2, padding=1),
                              Inception(16, 8, 8, 16, 4, 8, 8),
                              torch.nn.MaxPool2d(3, stride=2, ceil_mode=True),
                              Inception(40, 16, 8, 16, 4, 8, 8),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(48, 10))
    return _vision(net, 32)


def build_shufflenet_v2(tiny):
    """Channel split and shuffle (Reshape -> Transpose -> Reshape) between depthwise blocks."""
    import torchvision
    m = (torchvision.models.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=10) if tiny
         else torchvision.models.shufflenet_v2_x1_0())
    return _vision(m, 32 if tiny else 224)


def build_efficientnet_v2(tiny):
    """Fused MBConv (a full 3x3 convolution instead of expand + depthwise) in the early stages."""
    import torch
    import torchvision
    from functools import partial
    from torchvision.models import efficientnet as en
    if not tiny:
        return _vision(torchvision.models.efficientnet_v2_s(), 224)
    setting = [en.FusedMBConvConfig(1, 3, 1, 8, 8, 1), en.FusedMBConvConfig(4, 3, 2, 8, 16, 1),
               en.MBConvConfig(4, 3, 2, 16, 24, 1)]
    return _vision(en.EfficientNet(setting, 0.2, num_classes=10, last_channel=64,
                                   norm_layer=partial(torch.nn.BatchNorm2d, eps=1e-3)), 32)


def build_maxvit(tiny):
    """MaxViT: MBConv, then attention over local blocks and over a dilated grid, relative position bias."""
    import torchvision
    if not tiny:
        return _vision(torchvision.models.maxvit_t(), 224)
    return _vision(torchvision.models.MaxVit(input_size=(32, 32), stem_channels=8, partition_size=2,
                                             block_channels=[16, 32], block_layers=[1, 1], head_dim=8,
                                             stochastic_depth_prob=0.0, num_classes=10), 32)


def build_swin_v2(tiny):
    """Swin V2: scaled cosine attention, a continuous position bias from an MLP, post-norm."""
    import torchvision
    from torchvision.models import swin_transformer as st
    if not tiny:
        return _vision(torchvision.models.swin_v2_t(), 256)
    return _vision(st.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                                      window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=10,
                                      block=st.SwinTransformerBlockV2, downsample_layer=st.PatchMergingV2), 32)


def build_deeplabv3(tiny):
    """DeepLabV3: an atrous spatial pyramid (dilated convolutions and a pooled branch resized back), upsampled."""
    import torch
    import torchvision
    from torchvision.models.segmentation.deeplabv3 import ASPP, DeepLabV3
    if not tiny:
        return _vision(torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights_backbone=None,
                                                                                   num_classes=21), 224,
                       pick=lambda o: o["out"])
    backbone, channels = _tiny_segmentation_backbone()
    head = torch.nn.Sequential(ASPP(channels, [2, 4, 6], out_channels=16),
                               torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                               torch.nn.ReLU(), torch.nn.Conv2d(16, 5, 1))
    return _vision(DeepLabV3(backbone, head), 32, pick=lambda o: o["out"])


def build_deberta_v2(tiny):
    """DeBERTa-v2/v3: disentangled attention (content-to-position and position-to-content terms), log buckets."""
    from transformers import DebertaV2Config, DebertaV2Model
    common = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                  share_att_key=True, position_biased_input=False, max_relative_positions=-1)
    cfg = (DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64, position_buckets=16, **common) if tiny
           else DebertaV2Config(vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                intermediate_size=3072, max_position_embeddings=512, position_buckets=256,
                                **common))
    return _text(DebertaV2Model(cfg).eval(), cfg.vocab_size, _first)


def build_phi3(tiny):
    """Phi-3: one GEMM for q, k and v, one for gate and up (SwiGLU), rotary embeddings."""
    from transformers import Phi3Config, Phi3Model
    cfg = (Phi3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, use_cache=False,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2) if tiny
           else Phi3Config(vocab_size=32064, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                           num_attention_heads=16, num_key_value_heads=16, use_cache=False, pad_token_id=0))
    return _text(Phi3Model(cfg).eval(), cfg.vocab_size, _first)


def build_gpt_neox(tiny):
    """GPT-NeoX (Pythia): fused QKV, rotary on a quarter of each head, attention and MLP in parallel."""
    from transformers import GPTNeoXConfig, GPTNeoXModel
    cfg = (GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25, use_cache=False)
           if tiny else GPTNeoXConfig(vocab_size=50304, hidden_size=1024, num_hidden_layers=12,
                                      num_attention_heads=16, intermediate_size=4096, rotary_pct=0.25,
                                      use_cache=False))
    return _text(GPTNeoXModel(cfg).eval(), cfg.vocab_size, _first)


def build_segformer(tiny):
    """SegFormer: attention over spatially reduced keys and values, Mix-FFN (depthwise convolution), an MLP decoder
    that resizes and concatenates every stage."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    cfg = (SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                           patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                           decoder_hidden_size=32, num_labels=5) if tiny else SegformerConfig(num_labels=150))
    return _vision(SegformerForSemanticSegmentation(cfg).eval(), 32 if tiny else 224, pick=lambda o: o.logits)


def build_wav2vec2(tiny):
    """wav2vec 2.0: a convolutional feature encoder over raw audio (group norm), a grouped positional convolution."""
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    cfg = (Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32) if tiny
           else Wav2Vec2Config())
    torch.manual_seed(1)
    samples = 400 if tiny else 16000
    m = _Tuple.wrap(Wav2Vec2Model(cfg).eval(), _first)
    audio = lambda b: torch.randn(b, samples)  # noqa: E731
    return Built(m, {"input_values": audio(EXPORT_BATCH)}, {"input_values": audio(TEST_BATCH)},
                 {"input_values": {0: "batch"}}, ["last_hidden_state"])


def build_dinov2(tiny):
    """DINOv2: position embeddings resized by bicubic interpolation, layer scale."""
    from transformers import Dinov2Config, Dinov2Model
    cfg = (Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=32,
                        patch_size=8) if tiny else Dinov2Config())
    return _vision(Dinov2Model(cfg).eval(), 32 if tiny else 224, pick=_first)


def build_mobilevit(tiny):
    """MobileViT: convolutions, then transformers over unfolded patches folded back into the feature map."""
    from transformers import MobileViTConfig, MobileViTModel
    cfg = (MobileViTConfig(image_size=64, patch_size=2, hidden_sizes=[16, 24, 32],
                           neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2, mlp_ratio=2.0,
                           expand_ratio=2.0) if tiny else MobileViTConfig())
    return _vision(MobileViTModel(cfg).eval(), 64 if tiny else 256, pick=_first)


def build_convnextv2(tiny):
    """ConvNeXt V2: global response normalisation (a spatial L2 norm over its channel mean)."""
    from transformers import ConvNextV2Config, ConvNextV2Model
    cfg = (ConvNextV2Config(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32) if tiny
           else ConvNextV2Config())
    return _vision(ConvNextV2Model(cfg).eval(), 32 if tiny else 224, pick=_first)


# -- added for issue 42's check on architectures the suite had not shown (2026-12-07): attention biases from a
# table (LeViT), pooling as the token mixer (PoolFormer), token-mixing MLPs over transposed maps (MLP-Mixer),
# cross-covariance attention over channels (XCiT), talking heads and class attention (CaiT), weights standardised in
# the forward pass (NFNet), 3-D convolutions over video (R3D), ALiBi (BLOOM), q/k/v biases with GQA (Qwen2), learned
# positions from the mask's cumulative sum (OPT), an encoder-decoder with cross-attention (BART), relative position
# buckets (MPNet), shared layers and factorised embeddings (ALBERT), bottlenecks with NoNorm (MobileBERT), grouped
# 1-D convolutions as projections (SqueezeBERT) --

def build_levit(tiny):
    """LeViT: attention with a learned bias per head and offset (gathered from a table), BatchNorm after linears."""
    import timm
    from timm.models.levit import Levit
    if not tiny:
        return _vision(timm.create_model("levit_128s", pretrained=False), 224)
    return _vision(Levit(img_size=64, embed_dim=(16, 32), key_dim=8, num_heads=(2, 2), depth=(1, 1),
                         num_classes=10), 64)


def build_poolformer(tiny):
    """PoolFormer: average pooling (padding not counted) minus its input as the token mixer, GroupNorm over C, H, W."""
    import timm
    import torch
    from timm.models.metaformer import GroupNorm1, MetaFormer
    if not tiny:
        return _vision(timm.create_model("poolformer_s12", pretrained=False), 224)
    return _vision(MetaFormer(depths=(1, 1), dims=(16, 32), downsample_norm=None, mlp_act=torch.nn.GELU,
                              mlp_bias=True, norm_layers=GroupNorm1, layer_scale_init_values=1e-5,
                              res_scale_init_values=None, use_mlp_head=False, num_classes=10), 32)


def build_mixer(tiny):
    """MLP-Mixer: MLPs over the tokens (a transposed map) and over the channels, no attention."""
    import timm
    from timm.models.mlp_mixer import MlpMixer
    if not tiny:
        return _vision(timm.create_model("mixer_b16_224", pretrained=False), 224)
    return _vision(MlpMixer(img_size=32, patch_size=8, num_blocks=2, embed_dim=32, num_classes=10), 32)


def build_xcit(tiny):
    """XCiT: attention over channels (L2-normalised queries and keys across tokens, a learned temperature), local
    patch interaction by depthwise convolutions, Fourier position encodings, class attention."""
    import timm
    from timm.models.xcit import Xcit
    if not tiny:
        return _vision(timm.create_model("xcit_tiny_12_p16_224", pretrained=False), 224)
    return _vision(Xcit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, cls_attn_layers=1,
                        tokens_norm=True, num_classes=10), 32)


def build_cait(tiny):
    """CaiT: talking-heads attention (linears across the heads before and after the softmax), class attention."""
    import timm
    from timm.models.cait import Cait
    if not tiny:
        return _vision(timm.create_model("cait_xxs24_224", pretrained=False), 224)
    return _vision(Cait(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, depth_token_only=1,
                        init_values=1e-5, num_classes=10), 32)


def build_nfnet(tiny):
    """NFNet: convolutions whose weights are standardised in the forward pass, 'same' padding computed from the
    input, scaled activations, squeeze-excitation, no normalisation of activations."""
    import timm
    from timm.models.nfnet import NfCfg, NormFreeNet
    if not tiny:
        return _vision(timm.create_model("dm_nfnet_f0", pretrained=False), 224)
    cfg = NfCfg(depths=(1, 1, 1, 1), channels=(16, 32, 32, 32), stem_type="deep_quad", stem_chs=16, group_size=8,
                bottle_ratio=0.5, extra_conv=True, gamma_in_act=True, same_padding=True, skipinit=True,
                num_features=64, act_layer="gelu", attn_layer="se", attn_kwargs=dict(rd_ratio=0.5))
    return _vision(NormFreeNet(cfg, num_classes=10), 32)


def build_r3d(tiny):
    """R3D-18: video classification by 3-D convolutions over (time, height, width)."""
    import torch
    import torchvision
    from torchvision.models.video.resnet import BasicBlock, Conv3DSimple
    torch.manual_seed(1)
    if not tiny:
        m, clip = torchvision.models.video.r3d_18(), (3, 8, 112, 112)
    else:
        down = torch.nn.Sequential(torch.nn.Conv3d(8, 16, 1, stride=2, bias=False), torch.nn.BatchNorm3d(16))
        m = torch.nn.Sequential(torch.nn.Conv3d(3, 8, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
                                torch.nn.BatchNorm3d(8), torch.nn.ReLU(), BasicBlock(8, 8, Conv3DSimple),
                                BasicBlock(8, 16, Conv3DSimple, stride=2, downsample=down),
                                torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
        clip = (3, 4, 32, 32)
    video = lambda b: torch.randn(b, *clip)  # noqa: E731
    return Built(m.eval(), {"video": video(EXPORT_BATCH)}, {"video": video(TEST_BATCH)}, {"video": {0: "batch"}},
                 ["output"])


def build_bloom(tiny):
    """BLOOM: ALiBi (a per-head linear bias on the scores instead of position embeddings), embedding LayerNorm."""
    from transformers import BloomConfig, BloomModel
    cfg = (BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4, use_cache=False) if tiny
           else BloomConfig(vocab_size=32000, hidden_size=1024, n_layer=12, n_head=16, use_cache=False))
    return _text(BloomModel(cfg).eval(), cfg.vocab_size, _first, max_seq=512)


def build_qwen2(tiny):
    """Qwen2: q, k and v projections with biases, grouped-query attention, rotary, SwiGLU, RMSNorm."""
    from transformers import Qwen2Config, Qwen2Model
    cfg = (Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
           if tiny else Qwen2Config(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                    num_attention_heads=16, num_key_value_heads=2, use_cache=False))
    return _text(Qwen2Model(cfg).eval(), cfg.vocab_size, _first, max_seq=512)


def build_opt(tiny):
    """OPT: learned positions taken from the attention mask's cumulative sum, ReLU MLPs, pre-norm."""
    from transformers import OPTConfig, OPTModel
    cfg = (OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                     max_position_embeddings=64, word_embed_proj_dim=32, use_cache=False) if tiny
           else OPTConfig(vocab_size=50272, hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
                          num_attention_heads=12, word_embed_proj_dim=768, use_cache=False))
    return _text(OPTModel(cfg).eval(), cfg.vocab_size, _first)


def build_bart(tiny):
    """BART: an encoder-decoder, the decoder with causal self-attention and cross-attention over the encoder."""
    import torch
    from transformers import BartConfig, BartModel
    cfg = (BartConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                      use_cache=False) if tiny
           else BartConfig(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
                           encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                           decoder_ffn_dim=3072, use_cache=False))
    names = ["input_ids", "attention_mask", "decoder_input_ids"]
    torch.manual_seed(1)

    def feeds(batch, seq):
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq - 2:] = 0
        return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq)), "attention_mask": mask,
                "decoder_input_ids": torch.randint(0, cfg.vocab_size, (batch, seq))}

    dyn = {n: {0: "batch", 1: "sequence"} for n in names}
    return Built(_Tuple.wrap(BartModel(cfg).eval(), _first, names), feeds(EXPORT_BATCH, EXPORT_SEQ),
                 feeds(TEST_BATCH, TEST_SEQ), dyn, ["last_hidden_state"], max_seq=cfg.max_position_embeddings)


def build_mpnet(tiny):
    """MPNet: a relative position bias from log buckets added to every layer's scores."""
    from transformers import MPNetConfig, MPNetModel
    cfg = (MPNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=66) if tiny else MPNetConfig())
    return _text(MPNetModel(cfg, add_pooling_layer=False).eval(), cfg.vocab_size, _first,
                 max_seq=cfg.max_position_embeddings - 2)


def build_albert(tiny):
    """ALBERT: factorised embeddings (a projection from 128), one layer's weights shared by every layer."""
    from transformers import AlbertConfig, AlbertModel
    cfg = (AlbertConfig(vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64) if tiny
           else AlbertConfig(vocab_size=30000, embedding_size=128, hidden_size=768, num_hidden_layers=12,
                             num_attention_heads=12, intermediate_size=3072))
    return _text(AlbertModel(cfg, add_pooling_layer=False).eval(), cfg.vocab_size, _first)


def build_mobilebert(tiny):
    """MobileBERT: 24 thin layers of bottlenecks, stacked FFNs and NoNorm (an elementwise affine, no statistics)."""
    from transformers import MobileBertConfig, MobileBertModel
    cfg = (MobileBertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, embedding_size=16, intra_bottleneck_size=32,
                            true_hidden_size=32, num_feedforward_networks=2, max_position_embeddings=64) if tiny
           else MobileBertConfig())
    return _text(MobileBertModel(cfg, add_pooling_layer=False).eval(), cfg.vocab_size, _first)


def build_squeezebert(tiny):
    """SqueezeBERT: the projections as grouped 1-D convolutions over [batch, channels, sequence]."""
    from transformers import SqueezeBertConfig, SqueezeBertModel
    cfg = (SqueezeBertConfig(vocab_size=100, hidden_size=32, embedding_size=32, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, q_groups=4,
                             k_groups=4, v_groups=4, post_attention_groups=2, intermediate_groups=4,
                             output_groups=4) if tiny else SqueezeBertConfig())
    return _text(SqueezeBertModel(cfg).eval(), cfg.vocab_size, _first)


ARCHS: List[Arch] = [
    Arch("resnet", "CNN", "timm (tiny) / torchvision resnet50", build_resnet),
    Arch("mobilenet_v2", "CNN", "torchvision", build_mobilenet_v2),
    Arch("mobilenet_v3", "CNN", "torchvision (HardSwish, HardSigmoid, squeeze-excitation)", build_mobilenet_v3),
    Arch("efficientnet", "CNN", "torchvision efficientnet_b0 (SiLU, squeeze-excitation)", build_efficientnet),
    Arch("regnet", "CNN", "torchvision regnet_y (grouped convolutions, squeeze-excitation)", build_regnet),
    Arch("convnext", "CNN", "torchvision convnext (LayerNorm over channels, GELU, layer scale)", build_convnext),
    Arch("densenet", "CNN", "torchvision densenet (Concat)", build_densenet),
    Arch("fcn", "segmentation", "torchvision FCN / LRASPP on MobileNetV3 (Resize)", build_fcn),
    Arch("ssdlite", "detection", "torchvision SSDlite (NMS, TopK, data-dependent shapes)", build_ssdlite),
    Arch("vit", "vision transformer", "timm VisionTransformer", build_vit),
    Arch("deit", "vision transformer", "transformers DeiT", build_deit),
    Arch("beit", "vision transformer", "transformers BEiT (relative position bias)", build_beit),
    Arch("swin", "vision transformer", "timm Swin (windows, rolls)", build_swin),
    Arch("bert", "text encoder", "transformers BERT", build_bert),
    Arch("distilbert", "text encoder", "transformers DistilBERT", build_distilbert),
    Arch("roberta", "text encoder", "transformers RoBERTa", build_roberta),
    Arch("t5_encoder", "text encoder", "transformers T5 encoder (relative attention buckets)", build_t5_encoder),
    Arch("gpt2", "decoder", "transformers GPT-2 (causal mask)", build_gpt2),
    Arch("llama", "decoder", "transformers Llama (RMSNorm, rotary, GQA, SwiGLU)", build_llama),
    Arch("whisper_encoder", "audio encoder", "transformers Whisper encoder (Conv1d)", build_whisper_encoder),
    Arch("clip_text", "multimodal", "transformers CLIP text tower", build_clip_text),
    Arch("clip_vision", "multimodal", "transformers CLIP vision tower", build_clip_vision),
    Arch("resnext", "CNN", "timm (tiny) / torchvision resnext50_32x4d (grouped convolutions)", build_resnext),
    Arch("inception", "CNN", "torchvision GoogLeNet Inception blocks (parallel branches, Concat)", build_inception),
    Arch("shufflenet_v2", "CNN", "torchvision ShuffleNetV2 (channel split and shuffle)", build_shufflenet_v2),
    Arch("efficientnet_v2", "CNN", "torchvision efficientnet_v2 (fused MBConv)", build_efficientnet_v2),
    Arch("maxvit", "vision transformer", "torchvision MaxViT (block and grid attention, MBConv)", build_maxvit),
    Arch("swin_v2", "vision transformer", "torchvision Swin V2 (cosine attention, continuous position bias)",
         build_swin_v2),
    Arch("deeplabv3", "segmentation", "torchvision DeepLabV3 (atrous spatial pyramid)", build_deeplabv3),
    Arch("segformer", "segmentation", "transformers SegFormer (spatial-reduction attention, Mix-FFN)",
         build_segformer),
    Arch("deberta_v2", "text encoder", "transformers DeBERTa-v2 (disentangled attention)", build_deberta_v2),
    Arch("phi3", "decoder", "transformers Phi-3 (fused QKV and gate/up projections)", build_phi3),
    Arch("gpt_neox", "decoder", "transformers GPT-NeoX (partial rotary, parallel residual)", build_gpt_neox),
    Arch("wav2vec2", "audio encoder", "transformers wav2vec 2.0 (conv feature encoder, group norm)", build_wav2vec2),
    Arch("dinov2", "vision transformer", "transformers DINOv2 (bicubic position embeddings, layer scale)",
         build_dinov2),
    Arch("mobilevit", "vision transformer", "transformers MobileViT (unfolded patches)", build_mobilevit),
    Arch("convnextv2", "CNN", "transformers ConvNeXt V2 (global response norm)", build_convnextv2),
    Arch("levit", "vision transformer", "timm LeViT (attention bias table, BatchNorm after linears)", build_levit),
    Arch("poolformer", "CNN", "timm PoolFormer (pooling token mixer, GroupNorm)", build_poolformer),
    Arch("mixer", "MLP", "timm MLP-Mixer (token-mixing MLPs over transposed maps)", build_mixer),
    Arch("xcit", "vision transformer", "timm XCiT (cross-covariance attention over channels)", build_xcit),
    Arch("cait", "vision transformer", "timm CaiT (talking heads, class attention)", build_cait),
    Arch("nfnet", "CNN", "timm NFNet-F0 (weights standardised in the forward pass, same padding)", build_nfnet),
    Arch("r3d", "video", "torchvision R3D-18 (3-D convolutions)", build_r3d),
    Arch("bloom", "decoder", "transformers BLOOM (ALiBi)", build_bloom),
    Arch("qwen2", "decoder", "transformers Qwen2 (q/k/v biases, GQA)", build_qwen2),
    Arch("opt", "decoder", "transformers OPT (positions from the mask's cumulative sum)", build_opt),
    Arch("bart", "encoder-decoder", "transformers BART (cross-attention)", build_bart),
    Arch("mpnet", "text encoder", "transformers MPNet (relative position buckets)", build_mpnet),
    Arch("albert", "text encoder", "transformers ALBERT (shared layers, factorised embeddings)", build_albert),
    Arch("mobilebert", "text encoder", "transformers MobileBERT (bottlenecks, NoNorm)", build_mobilebert),
    Arch("squeezebert", "text encoder", "transformers SqueezeBERT (grouped 1-D convolutions)", build_squeezebert),
]


# ----------------------------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------------------------


def _as_tuple(out):
    import torch
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


def _cast_inputs(inputs, dtype, device):
    import torch
    return {k: (v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device)) for k, v in inputs.items()}


def realistic_weights(module, calibration: Dict[str, "object"]) -> None:
    """Random weights that behave like trained ones: batch-norm statistics measured on random data (so each
    normalises, instead of the identity of fresh statistics that lets activations vanish), random affine
    parameters, layer-scale factors of O(0.1) instead of 1e-6, and random values in weight matrices initialised
    to zeros (a zero classifier makes every output its bias). Keeps every model's output O(1), so that the
    comparisons with PyTorch can fail."""
    import torch
    g = torch.Generator().manual_seed(2)
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            scale_leaves = ("gamma", "lambda_1", "lambda_2", "gamma_1", "gamma_2", "skipinit_gain")
            if "layer_scale" in name or leaf in scale_leaves or ".grn." in name:
                p.copy_(torch.rand(p.shape, generator=g) * 0.4 + 0.1)
            elif p.dim() >= 2 and not torch.any(p):  # a zero-initialised classifier (timm's MLP-Mixer): a constant out
                p.copy_(torch.randn(p.shape, generator=g) / float(p.shape[-1]) ** 0.5)
        for m in norms:
            if m.affine:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the calibration batches
        if norms:
            # Only the norms in training mode (a detector's forward in training mode wants targets); a batch of 16
            # random inputs, so that statistics over 1x1 maps are not those of two samples.
            module.eval()
            for m in norms:
                m.train()
            for _ in range(2):
                module(*[torch.randn(16, *x.shape[1:], generator=g) if x.is_floating_point() else x
                         for x in calibration.values()])
            module.eval()


def _run_torch(module, inputs, dtype, device):
    import copy
    import torch
    m = copy.deepcopy(module).to(device=device, dtype=dtype)  # never round the weights the exports use
    with torch.no_grad():
        return [o.detach().to("cpu", torch.float64).numpy() for o in
                _as_tuple(m(*_cast_inputs(inputs, dtype, device).values()))]


def _max_err(a, b):
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _export_one(built: Built, exporter: str, dtype: str, path: pathlib.Path, device: str, tiny: bool = False) -> None:
    import torch
    import copy
    tdtype = torch.float32 if dtype == "float32" else torch.float16
    m = copy.deepcopy(built.module).to(device=device, dtype=tdtype)
    args = tuple(_cast_inputs(built.inputs, tdtype, device).values())
    names = list(built.inputs)
    if exporter == "torchscript":
        dynamic_axes = {k: dict(v) for k, v in built.dynamic.items()}
        torch.onnx.export(m, args, str(path), dynamo=False, opset_version=OPSET[exporter], input_names=names,
                          output_names=built.outputs, dynamic_axes=dynamic_axes or None, do_constant_folding=True)
    else:
        dims: Dict[str, object] = {}
        shapes = []
        for n in names:
            axes = built.dynamic.get(n, {})
            shapes.append({a: dims.setdefault(s, torch.export.Dim(s, min=2, max=built.max_seq if s == "sequence"
                                                                 else 1024)) for a, s in axes.items()} or None)
        torch.onnx.export(m, args, str(path), dynamo=True, opset_version=OPSET[exporter], input_names=names,
                          output_names=built.outputs, dynamic_shapes=tuple(shapes) if built.dynamic else None,
                          external_data=False)
    import onnx
    model = onnx.load(str(path))
    changed = model.ir_version > 10
    if changed:  # ONNX Runtime 1.29 and Debian's onnx read IR <= 10 models of these opsets
        model.ir_version = 10
    if tiny:  # the committed files: without the dynamo exporter's per-node stack traces (60% of a tiny file)
        for node in model.graph.node:
            changed = changed or len(node.metadata_props) > 0
            del node.metadata_props[:]
    if changed:
        onnx.save(model, str(path))


def export(out: pathlib.Path, tiny: bool, names: Optional[List[str]], exporters, dtypes) -> int:
    import torch
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    manifest_path = out / "manifest.json"
    manifest = {"models": {}}
    try:  # processes exporting into one folder at once (model_suite_bench --prepare-jobs) each write it whole
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError):
        pass
    manifest.update({"torch": torch.__version__, "tiny": tiny, "test_batch": TEST_BATCH, "test_seq": TEST_SEQ})
    failures = 0
    for arch in ARCHS:
        if names and arch.name not in names:
            continue
        entry = {"family": arch.family, "library": arch.library, "exports": {}, "errors": {}}
        try:
            torch.manual_seed(0)
            built = arch.build(tiny)
            realistic_weights(built.module, built.inputs)
            ref = _run_torch(built.module, built.test_inputs, torch.float64, "cpu")
            torch_err = {}
            for dt, tdt, dev in (("float32", torch.float32, "cpu"), ("float16", torch.float16, device)):
                try:
                    got = _run_torch(built.module, built.test_inputs, tdt, dev)
                    torch_err[dt] = [_max_err(g, r) for g, r in zip(got, ref)]
                except Exception as e:  # noqa: BLE001  (float16 on a CPU without such kernels)
                    entry["errors"][f"torch {dt}"] = str(e).splitlines()[0][:300]
            feeds = {k: v.numpy() for k, v in built.test_inputs.items()}
            np.savez_compressed(out / f"{arch.name}.npz", **{f"in.{k}": v for k, v in feeds.items()},
                                **{f"ref.{n}": r for n, r in zip(built.outputs, ref)})
            entry.update({"inputs": list(built.inputs), "outputs": built.outputs, "torch_error": torch_err,
                          "data_dependent": built.data_dependent,
                          "params": int(sum(p.numel() for p in built.module.parameters()))})
        except Exception as e:  # noqa: BLE001
            entry["errors"]["build"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            traceback.print_exc()
            print(f"{arch.name:18s} build FAILED: {entry['errors']['build']}", flush=True)
            manifest["models"][arch.name] = entry
            failures += 1
            continue
        for exporter in exporters:
            for dtype in dtypes:
                path = out / f"{arch.name}.{exporter}.{dtype}.onnx"
                t0 = time.time()
                try:
                    _export_one(built, exporter, dtype, path, device, tiny)
                    entry["exports"][f"{exporter}.{dtype}"] = path.name
                    print(f"{arch.name:18s} {exporter:11s} {dtype:8s} ok  {path.stat().st_size / 1024:8.1f} KiB "
                          f"{time.time() - t0:5.1f} s", flush=True)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    cause = e.__cause__ or e
                    text = str(cause).strip()
                    msg = f"{type(cause).__name__}: {text[:600]}"
                    entry["errors"][f"{exporter}.{dtype}"] = msg
                    print(f"{arch.name:18s} {exporter:11s} {dtype:8s} FAILED {msg}", flush=True)
                    path.unlink(missing_ok=True)
        manifest["models"][arch.name] = entry
    partial = manifest_path.with_name(f"{manifest_path.name}.{os.getpid()}")
    partial.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(partial, manifest_path)  # readers see the old file or the new one, never half of one
    return failures


# ----------------------------------------------------------------------------------------------------------------
# Run
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Result:
    model: str
    ok: bool
    detail: str
    seconds: float = 0.0
    kernels: Dict[str, int] = field(default_factory=dict)
    skipped: bool = False  # PyTorch's exporter could not write this model: nothing to run


def tolerance(dtype: str, torch_err: Optional[float], ref: np.ndarray) -> float:
    scale = float(np.max(np.abs(ref))) if ref.size else 1.0
    floor = FLOOR[dtype] * max(scale, 1e-6)
    return max(floor, ERROR_FACTOR * (torch_err or 0.0))


def compare_detections(dtype: str, got: Dict[str, np.ndarray], ref: Dict[str, np.ndarray]) -> Tuple[bool, str]:
    """Detections (boxes [N,4], scores [N], labels [N]) of a random-weight detector: near-tied scores make the
    order of rows and the last rows kept by NMS differ between any two precisions (PyTorch's own float32 and
    float64 disagree), so rows are matched, not compared by position: most of our detections must have a
    reference detection of the same label with the same box and score."""
    boxes, scores, labels = (np.asarray(got[k], np.float64) for k in ("boxes", "scores", "labels"))
    rboxes, rscores, rlabels = (np.asarray(ref[k], np.float64) for k in ("boxes", "scores", "labels"))
    if boxes.ndim != 2 or boxes.shape[1:] != rboxes.shape[1:] or not np.all(np.isfinite(boxes)):
        return False, f"boxes of shape {list(boxes.shape)}, PyTorch {list(rboxes.shape)}"
    n, rn = len(scores), len(rscores)
    if rn == 0 or n == 0:
        return n == rn, f"{n} detections, PyTorch {rn}"
    box_tol = (2e-3 if dtype == "float32" else 2e-2) * max(1.0, float(np.max(np.abs(rboxes))))
    score_tol = 1e-4 if dtype == "float32" else 1e-2
    matched = 0
    for i in range(n):
        same = (rlabels == labels[i]) & (np.abs(rscores - scores[i]) <= score_tol)
        same &= np.max(np.abs(rboxes - boxes[i]), axis=1) <= box_tol
        matched += bool(np.any(same))
    need = 0.9 if dtype == "float32" else 0.6
    ok = abs(n - rn) <= max(1, rn // 10) and matched >= need * n
    return ok, f"{n} detections (PyTorch {rn}), {matched} matched"


def compare(name: str, dtype: str, got: np.ndarray, ref: np.ndarray, torch_err: Optional[float]) -> Tuple[bool, str]:
    got = np.asarray(got)
    if got.shape != ref.shape:
        return False, f"{name}: shape {list(got.shape)}, PyTorch {list(ref.shape)}"
    err = _max_err(got, ref)
    tol = tolerance(dtype, torch_err, ref)
    return err <= tol and np.isfinite(err), f"{name}: max err {err:.2e} (tol {tol:.1e})"


def run_suite(directory: pathlib.Path, device: str, engine: str, names: Optional[List[str]], exporters, dtypes,
              fallback: str, verbose: bool) -> List[Result]:
    import xpuruntime as xrt
    manifest = json.loads((directory / "manifest.json").read_text())
    results: List[Result] = []
    for name, entry in sorted(manifest["models"].items()):
        if names and name not in names:
            continue
        data = np.load(directory / f"{name}.npz") if (directory / f"{name}.npz").exists() else None
        for exporter in exporters:
            for dtype in dtypes:
                key = f"{exporter}.{dtype}"
                label = f"{name}.{key}"
                if key not in entry.get("exports", {}):
                    why = entry.get("errors", {}).get(key) or entry.get("errors", {}).get("build") or "not exported"
                    results.append(Result(label, False, f"not exported: {why.splitlines()[0][:160]}", skipped=True))
                    continue
                t0 = time.perf_counter()
                try:
                    policy = xrt.ExecutionPolicy(fallback=fallback)
                    sess = xrt.InferenceSession(str(directory / entry["exports"][key]), device=device,
                                                engine=engine, exec_policy=policy)
                    feeds = {}
                    for info in sess.get_inputs():
                        x = data[f"in.{info.name}"]
                        feeds[info.name] = x.astype(np.float16) if (dtype == "float16" and x.dtype.kind == "f") else x
                    outs = sess.run(feeds)
                    oks, details = [], []
                    if entry.get("data_dependent"):
                        ok, detail = compare_detections(dtype, outs, {n: data[f"ref.{n}"] for n in entry["outputs"]})
                        oks.append(ok)
                        details.append(detail)
                    else:
                        for i, out_name in enumerate(entry["outputs"]):
                            ref = data[f"ref.{out_name}"]
                            err = (entry.get("torch_error", {}).get(dtype) or [None] * 99)[i]
                            ok, detail = compare(out_name, dtype, outs[out_name], ref, err)
                            oks.append(ok)
                            details.append(detail)
                    kernels: Dict[str, int] = {}
                    if engine != "onnxruntime":
                        for node in sess.explain().nodes:
                            kernels[node["kernel"]] = kernels.get(node["kernel"], 0) + 1
                    results.append(Result(label, all(oks), "; ".join(details), time.perf_counter() - t0, kernels))
                except Exception as e:  # noqa: BLE001
                    msg = str(e).strip()
                    first = msg.splitlines()[0] if msg else ""
                    if verbose:
                        first = msg
                    results.append(Result(label, False, f"{type(e).__name__}: {first}", time.perf_counter() - t0))
    return results


def merge(sources: List[pathlib.Path], into: pathlib.Path) -> List[str]:
    """Copies each source folder's exports and test data into `into` and adds their manifest entries to its
    manifest.json (an architecture's entry replaced whole): exports made by one process per architecture
    (scripts/gpu_session.sh's TINY_EXPORT) each write their own manifest. Returns the architectures merged."""
    import shutil
    into.mkdir(parents=True, exist_ok=True)
    target = into / "manifest.json"
    manifest = json.loads(target.read_text()) if target.exists() else {"models": {}}
    merged = []
    for source in sources:
        theirs = json.loads((source / "manifest.json").read_text())
        for key in ("torch", "tiny", "test_batch", "test_seq"):
            if key in theirs and manifest.get(key, theirs[key]) != theirs[key]:
                raise ValueError(f"{source}: manifest field {key!r} is {theirs[key]!r}, {target} has {manifest[key]!r}")
            manifest.setdefault(key, theirs.get(key))
        for name, entry in theirs["models"].items():
            files = [f"{name}.npz"] + list(entry.get("exports", {}).values())
            for f in files:
                if (source / f).exists():
                    shutil.copyfile(source / f, into / f)
            manifest["models"][name] = entry
            merged.append(name)
    target.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return merged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    ex = sub.add_parser("export", help="build the architectures and export them (needs torch)")
    ex.add_argument("--tiny", action="store_true", help="tiny configurations (the committed test data)")
    ex.add_argument("--out", type=pathlib.Path, default=None)
    ex.add_argument("--only", default="", help="comma-separated architecture names")
    ex.add_argument("--exporters", default=",".join(EXPORTERS))
    ex.add_argument("--dtypes", default=",".join(DTYPES))
    rn = sub.add_parser("run", help="run the exported models through InferenceSession and compare with PyTorch")
    rn.add_argument("--tiny", action="store_true", help=f"the committed tiny models ({TINY_DIR.relative_to(ROOT)})")
    rn.add_argument("--dir", type=pathlib.Path, default=None)
    rn.add_argument("--device", default="cpu")
    rn.add_argument("--engine", default="native")
    rn.add_argument("--fallback", default="error", choices=("error", "cpu"))
    rn.add_argument("--only", default="")
    rn.add_argument("--exporters", default=",".join(EXPORTERS))
    rn.add_argument("--dtypes", default=",".join(DTYPES))
    rn.add_argument("-v", "--verbose", action="store_true", help="whole error messages")
    mg = sub.add_parser("merge", help="copy exports made in separate folders (one process each) into one folder, "
                                      "their manifests' entries merged into its manifest.json")
    mg.add_argument("sources", nargs="+", type=pathlib.Path)
    mg.add_argument("--into", type=pathlib.Path, default=TINY_DIR)
    sub.add_parser("list", help="list the architectures")
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        merged = merge(args.sources, args.into)
        print(f"merge: {len(merged)} architecture(s) into {args.into / 'manifest.json'}: {', '.join(merged)}")
        return 0
    if args.cmd == "list":
        for a in ARCHS:
            print(f"{a.name:18s} {a.family:20s} {a.library}")
        return 0
    if args.cmd == "export":
        out = args.out or (TINY_DIR if args.tiny else ROOT / "models" / "suite" / "full")
        failures = export(out, args.tiny, [n for n in args.only.split(",") if n], args.exporters.split(","),
                          args.dtypes.split(","))
        print(f"export: {failures} failure(s); manifest in {out / 'manifest.json'}")
        return 0
    if args.cmd == "run":
        directory = args.dir or (TINY_DIR if args.tiny else ROOT / "models" / "suite" / "full")
        results = run_suite(directory, args.device, args.engine, [n for n in args.only.split(",") if n],
                            args.exporters.split(","), args.dtypes.split(","), args.fallback, args.verbose)
        for r in results:
            kernels = " ".join(f"{k}:{v}" for k, v in sorted(r.kernels.items()))
            status = "SKIP" if r.skipped else "PASS" if r.ok else "FAIL"
            print(f"{status} {r.model:40s} {r.seconds:6.2f} s  {r.detail}" + (f"  [{kernels}]" if kernels else ""))
        passed = sum(r.ok for r in results)
        skipped = sum(r.skipped for r in results)
        failed = len(results) - passed - skipped
        print(f"{passed} passed, {failed} failed" + (f" ({skipped} not exported by PyTorch)" if skipped else ""))
        return 0 if failed == 0 else 1
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
