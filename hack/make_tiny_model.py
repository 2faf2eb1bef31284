"""Writes a tiny randomly initialised Llama and a byte-level BPE tokenizer trained here (no model hub).

Usage: python make_tiny_model.py OUT_DIR  (run with the vLLM venv's Python: it needs transformers)
The model is 2 layers, hidden 256, vocab 4096 (~3 M parameters): fast enough on one CPU core that the
real-vLLM tests measure the data plane, not the model.
"""

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def training_text() -> list[str]:
    """Plain English-like lines, varied enough that BPE learns merges up to the vocabulary size."""
    words = [
        "the",
        "a",
        "prefill",
        "decode",
        "cache",
        "token",
        "request",
        "router",
        "engine",
        "model",
        "serving",
        "latency",
        "transfer",
        "block",
        "queue",
        "batch",
        "prompt",
        "output",
        "key",
        "value",
        "memory",
        "core",
        "thread",
        "pool",
        "scale",
        "replica",
        "metric",
        "signal",
        "time",
        "first",
        "second",
        "load",
        "user",
        "clock",
        "kernel",
        "tensor",
        "layer",
        "head",
        "vocab",
        "byte",
        "merge",
        "train",
        "local",
        "test",
        "run",
    ]
    lines = []
    for i in range(4000):
        picked = [words[(i * 7 + j * 13) % len(words)] for j in range(12)]
        lines.append(" ".join(picked) + f" {i} {i * 31 % 997}.")
    return lines


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(training_text(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
