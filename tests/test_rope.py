"""Rotary position embeddings against the formula, written independently with complex
numbers, and the property they exist for: scores depend on relative positions only."""

import math

import torch

from minibert.model.rope import _cached_angles, apply_rope, rope_angles


def _rope_by_complex_numbers(x: torch.Tensor, theta: float,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Pair (x_i, x_{i+hs/2}) as the complex number x_i + j x_{i+hs/2}, at position t
    multiplied by exp(j t theta^(-2i/hs)): RoFormer's rotation, in the half-split layout."""
    *_, T, hs = x.shape
    half = hs // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    t = torch.arange(T, dtype=torch.float64)[:, None]
    i = torch.arange(half, dtype=torch.float64)[None, :]
    z = z * torch.polar(torch.ones(T, half, dtype=torch.float64), t * theta ** (-2 * i / hs))
    return torch.cat((z.real, z.imag), dim=-1).to(dtype)


def test_rope_is_the_rotation_of_the_formula():
    x = torch.randn(2, 3, 17, 8)
    cos, sin = rope_angles(17, 8, 10000.0, torch.device("cpu"))
    assert torch.allclose(apply_rope(x, cos, sin), _rope_by_complex_numbers(x, 10000.0),
                          atol=1e-5)
    cos, sin = rope_angles(17, 8, 160000.0, torch.device("cpu"))
    assert torch.allclose(apply_rope(x, cos, sin), _rope_by_complex_numbers(x, 160000.0),
                          atol=1e-5)
    assert torch.equal(apply_rope(x, cos, sin)[..., 0, :], x[..., 0, :])  # position 0: no turn


def test_rope_scores_depend_on_the_offset_only():
    torch.manual_seed(0)
    q, k = torch.randn(16), torch.randn(16)
    cos, sin = rope_angles(40, 16, 10000.0, torch.device("cpu"))

    def score(m, n):
        qm = apply_rope(q.expand(1, 1, 40, 16), cos, sin)[0, 0, m]
        kn = apply_rope(k.expand(1, 1, 40, 16), cos, sin)[0, 0, n]
        return float(qm @ kn)

    assert math.isclose(score(3, 7), score(20, 24), rel_tol=1e-4)
    assert math.isclose(score(9, 2), score(37, 30), rel_tol=1e-4)
    assert not math.isclose(score(3, 7), score(3, 8), rel_tol=1e-3)
    # The norm of every vector is kept: rotations.
    rotated = apply_rope(q.expand(1, 1, 40, 16), cos, sin)[0, 0]
    assert torch.allclose(rotated.norm(dim=-1), q.norm().expand(40), rtol=1e-5)


def test_rope_keeps_the_dtype_and_computes_in_fp32():
    x = torch.randn(1, 2, 64, 8)
    cos, sin = rope_angles(64, 8, 10000.0, torch.device("cpu"))
    y = apply_rope(x.bfloat16(), cos, sin)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, apply_rope(x.bfloat16().float(), cos, sin).bfloat16())


def test_angles_first_made_under_inference_mode_still_train():
    """The angles are cached; made first inside torch.inference_mode() (an evaluation) they
    were inference tensors, which a later training step at that length cannot save for
    backward. The gradient through them is the right one: against finite differences."""
    import minibert
    from torch.func import functional_call

    _cached_angles.cache_clear()
    config = minibert.BertConfig.preset("modernbert-tiny", vocab_size=50,
                                        max_position_embeddings=64)
    torch.manual_seed(0)
    model = minibert.BertForMaskedLM(config)
    ids = torch.randint(5, 50, (2, 11))
    with torch.inference_mode():
        model.eval()(ids)
    model.train()(ids).logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)

    # In float64 (angles of its own, cached under inference mode as well), the gradient of a
    # weight every rotation lies downstream of, the embeddings' norm, equals the finite
    # differences of the loss: a rotation saved wrong for backward would show here.
    model = model.double()
    with torch.inference_mode():
        model.eval()(ids)
    model.train()
    name = "bert.embeddings.norm.weight"
    weight = dict(model.named_parameters())[name].detach().clone().requires_grad_(True)
    probe = torch.randn(2, 11, 50, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1))

    def loss(w):
        return (functional_call(model, {name: w}, (ids,)).logits * probe).sum()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest
    try:
        assert torch.autograd.gradcheck(loss, (weight,))
    finally:
        torch.set_num_threads(threads)



def test_a_float64_model_rotates_in_float64():
    """fp64 is how a reference check is run (gradcheck, a loop in float64); RoPE rounded its
    inputs to fp32 and capped every such check of a RoPE model near 1e-7."""
    from minibert.model.rope import rope_dtype

    x = torch.randn(2, 3, 50, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = rope_angles(50, 8, 10000.0, torch.device("cpu"), rope_dtype(x.dtype))
    want = _rope_by_complex_numbers(x.detach(), 10000.0, torch.float64)
    assert (apply_rope(x, cos, sin) - want).abs().max() < 1e-12
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, cos, sin), (x,))


def test_a_float64_rope_model_runs_its_rotations_in_float64(monkeypatch):
    """Through the model, not apply_rope alone: the attention layer must ask for fp64 angles
    (the layer is what passes `rope_dtype`)."""
    import minibert
    import minibert.model.model

    config = minibert.BertConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                                 intermediate_size=32, max_position_embeddings=64,
                                 position="rope", rope_theta=10000.0)
    model = minibert.BertModel(config).double().eval()
    ids = torch.randint(1, 50, (2, 30))
    with torch.no_grad():
        ours = model(ids).last_hidden_state
        monkeypatch.setattr(minibert.model.model, "apply_rope", lambda x, cos, sin:
                            _rope_by_complex_numbers(x, 10000.0, torch.float64))
        reference = model(ids).last_hidden_state
    assert ours.dtype == torch.float64 and (ours - reference).abs().max() < 1e-12
