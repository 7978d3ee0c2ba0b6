"""Generation with a KV cache (trainer/model.py): the cache changes the cost, never the tokens."""

from __future__ import annotations

import pytest
import torch
from factories import in_thread

from trainer.model import GPT, GPTConfig, sample_next


def _model(attention: str = "explicit", seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32, attention=attention))
    return model.eval()


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
@pytest.mark.parametrize("top_k", [0, 5])
def test_same_tokens_with_and_without_cache(attention, top_k):
    def run():
        model = _model(attention)
        prompt = torch.randint(0, 256, (3, 7), generator=torch.Generator().manual_seed(1))
        with_cache = model.generate(prompt, 12, use_cache=True, top_k=top_k,
                                    generator=torch.Generator().manual_seed(7))
        without = model.generate(prompt, 12, use_cache=False, top_k=top_k,
                                 generator=torch.Generator().manual_seed(7))
        return prompt, with_cache, without

    prompt, with_cache, without = in_thread(run)
    assert with_cache.shape == (3, 19)
    assert torch.equal(with_cache[:, :7], prompt)
    assert torch.equal(with_cache, without)


def test_cached_logits_match_full_forward():
    def run():
        model = _model()
        idx = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(2))
        with torch.inference_mode():
            full, _ = model(idx)
            cache = model.new_cache()
            first = model.prefill(idx[:, :6], cache)
            steps = [model.decode_step(idx[:, t:t + 1], cache) for t in range(6, 10)]
        return full, first, steps, cache

    full, first, steps, cache = in_thread(run)
    torch.testing.assert_close(first, full[:, 5, :], rtol=1e-4, atol=1e-5)
    for i, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[:, 6 + i, :], rtol=1e-4, atol=1e-5)
    assert cache.length == 10
    # grown cache: exactly 2 × layers × B × T × dim × 4 bytes (fp32), storages of its own
    assert cache.nbytes() == 2 * 2 * 2 * 10 * 32 * 4


def test_generate_refuses_past_block_size():
    model = _model()
    with pytest.raises(ValueError, match="block size"):
        model.generate(torch.zeros(1, 30, dtype=torch.long), 5)


def test_top_k_sampling_repeats_with_a_seed_and_stays_in_top_k():
    logits = torch.randn(4, 256, generator=torch.Generator().manual_seed(3))
    a = sample_next(logits, top_k=3, generator=torch.Generator().manual_seed(9))
    b = sample_next(logits, top_k=3, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)
    top3 = torch.topk(logits, 3, dim=-1).indices
    assert all(int(a[i, 0]) in top3[i].tolist() for i in range(4))
    assert torch.equal(sample_next(logits), logits.argmax(-1, keepdim=True))
