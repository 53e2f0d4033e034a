"""`ape`: the learned absolute embedding against its plain definition, timm's initialisation and its place in the ViT.

The definition: token i of every image gets x_i + e_i, with one learned e per patch position (ViT's APE), drawn
trunc-normal with std 0.02 as timm's `VisionTransformer` draws `pos_embed`; added once, to the patch
embeddings, before the first block. Its defining property, the one every relative encoding lacks: the
same content at another position gives another token (absolute, not relative, position).
"""
import torch

from rpevit.config import TrialConfig
from rpevit.models.factory import build_model
from rpevit.pe.absolute import LearnedAbsolute

CONTEXT = dict(grid=(3, 4), heads=2, head_dim=4)  # dim = heads x head_dim = 8, N = 12 tokens


def ape(seed: int = 0) -> LearnedAbsolute:
    torch.manual_seed(seed)
    return LearnedAbsolute(layer=0, seed=seed, **CONTEXT).double()


def test_each_token_gets_its_own_positions_vector_in_every_image():
    pe = ape()
    assert pe.embedding.shape == (1, 12, 8) and pe.embedding.requires_grad
    x = torch.randn(5, 12, 8, dtype=torch.float64)
    expected = torch.empty_like(x)
    for b in range(5):  # the plain definition, one token at a time
        for i in range(12):
            expected[b, i] = x[b, i] + pe.embedding[0, i]
    torch.testing.assert_close(pe.add_to_tokens(x), expected, rtol=0, atol=0)


def test_initialisation_is_timms_trunc_normal_std_002():
    """timm draws `pos_embed` with its own copy of trunc_normal_ (std .02, bounds +-2), rpevit with torch's:
    the same distribution from another random stream, so the draws are compared as distributions."""
    from scipy.stats import ks_2samp
    from timm.layers import trunc_normal_

    torch.manual_seed(0)
    drawn = LearnedAbsolute(grid=(16, 16), heads=4, head_dim=16).embedding.detach().flatten()  # 16,384 draws
    reference = torch.zeros(drawn.numel())
    trunc_normal_(reference, std=0.02)  # timm VisionTransformer: trunc_normal_(self.pos_embed, std=.02)
    assert 0.0195 < drawn.std().item() < 0.0205 and abs(drawn.mean().item()) < 0.0005, (drawn.std(), drawn.mean())
    assert ks_2samp(drawn.numpy(), reference.numpy()).pvalue > 0.01
    wider = torch.zeros(drawn.numel())
    trunc_normal_(wider, std=0.022)  # the test tells a 10% wider draw apart
    assert ks_2samp(drawn.numpy(), wider.numpy()).pvalue < 0.01


def test_the_same_content_at_another_position_is_another_token():
    pe = ape()
    x = torch.randn(1, 1, 8, dtype=torch.float64).expand(1, 12, 8)  # one patch's content at every position
    out = pe.add_to_tokens(x)[0]
    assert torch.cdist(out, out).add(torch.eye(12, dtype=torch.float64)).min() > 0  # 12 distinct tokens


def test_the_vit_adds_it_once_to_the_patch_embeddings_before_the_first_block():
    cfg = TrialConfig.from_dict(dict(image_size=8, patch_size=2, dim=16, heads=2, depth=1, pe="ape"))
    torch.manual_seed(0)
    model = build_model(cfg, in_chans=3, num_classes=10).double().eval()
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    (pe,) = model.token_encodings
    seen = []
    hook = model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    try:
        model.forward_features(images)
    finally:
        hook.remove()
    torch.testing.assert_close(seen[0], model.patch_embed(images) + pe.embedding, rtol=0, atol=0)
