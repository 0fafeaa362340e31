import pytest
import torch

from mnist_helpers.models import FastNet, Net, NetBN, build_model, count_parameters, flops_per_image


@pytest.mark.parametrize("cls,params", [(Net, 1_199_882), (NetBN, 1_200_074), (FastNet, 35_890)])
def test_parameter_counts_match_docstrings(cls, params):
    model = cls()
    assert count_parameters(model) == params
    assert f"{params:,}" in cls.__doc__


@pytest.mark.parametrize("name", ["net", "netbn", "fastnet"])
def test_output_is_log_probabilities(name):
    model = build_model(name).eval()
    out = model(torch.randn(5, 1, 28, 28))
    assert out.shape == (5, 10)
    assert torch.allclose(out.exp().sum(1), torch.ones(5), atol=1e-5)


def test_net_matches_the_article_layer_by_layer():
    net = Net()
    assert [tuple(p.shape) for p in net.parameters()] == [
        (32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 9216), (128,), (10, 128), (10,)]


def test_flops_and_unknown_model():
    assert flops_per_image(Net()) == 2 * (26 * 26 * 32 * 9 + 24 * 24 * 64 * 32 * 9 + 9216 * 128 + 1280)
    assert flops_per_image(FastNet()) < flops_per_image(Net()) / 3
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        build_model("resnet")
