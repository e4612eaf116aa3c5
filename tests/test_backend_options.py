"""Backend options mean the same on every backend: one ``kernels=`` vocabulary, and an option a
backend does not take (a misspelling) is an error listing the ones it does, never ignored and
never a reason to fall back to the CPU."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import gpumnn
from gpumnn.backends import backend_class, create_backend
from gpumnn.backends.base import KERNEL_FAMILIES, KERNELS_ENV
from gpumnn.errors import BackendOptionError


def _relu_net() -> gpumnn.Net:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))])
    return gpumnn.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def test_unknown_option_is_an_error_naming_the_valid_ones(backend):
    options = backend_class(backend).options()
    assert "kernels" in options
    with pytest.raises(BackendOptionError) as err:
        create_backend(backend, kernals="simd")
    message = str(err.value)
    assert "'kernals'" in message and backend in message
    for option in options:
        assert option in message


def test_session_with_an_unknown_option_refuses_instead_of_falling_back(backend):
    with pytest.raises(BackendOptionError, match="kernals"):
        _relu_net().session(backend=backend, kernals="simd")  # fallback=True: still an error


#: kernel families a backend refuses when named outright: CUDA compiles the GPU ("tiled") kernels only,
#: the "simd" ones use OpenCL vector types that CUDA C lacks
REFUSED_FAMILIES = {"cuda": ("simd",)}


@pytest.mark.parametrize("kernels", KERNEL_FAMILIES)
def test_kernels_vocabulary_is_accepted_everywhere(backend, kernels):
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    if kernels in REFUSED_FAMILIES.get(backend, ()):
        with pytest.raises(BackendOptionError, match=f"kernels='{kernels}'.*GPU kernels only"):
            _relu_net().session(backend=backend, kernels=kernels, fallback=False)
        return
    with _relu_net().session(backend=backend, kernels=kernels, fallback=False) as sess:
        np.testing.assert_array_equal(sess.run({"x": x})["y"], np.maximum(x, 0))
        family = getattr(sess.backends[backend], "kernels", None)  # NumPy has one family
        if family is not None:
            assert family == kernels if kernels != "auto" else family in ("simd", "tiled")


@pytest.mark.parametrize("value", ["gpu", "cpu", "fast"])
def test_other_kernels_values_are_errors(backend, value):
    with pytest.raises(BackendOptionError, match="'auto', 'simd', 'tiled'"):
        create_backend(backend, kernels=value)


def test_kernels_environment_variable_is_the_default(backend, monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "gpu")
    with pytest.raises(BackendOptionError, match=KERNELS_ENV):
        create_backend(backend)
    monkeypatch.setenv(KERNELS_ENV, "simd")  # a preference: a backend without simd kernels keeps its own
    be = create_backend(backend)
    try:
        assert getattr(be, "kernels", "simd") == ("tiled" if "simd" in REFUSED_FAMILIES.get(backend, ()) else "simd")
    finally:
        be.close()
    be = create_backend(backend, kernels="tiled")  # an explicit value wins
    try:
        assert getattr(be, "kernels", "tiled") == "tiled"
    finally:
        be.close()


def test_device_option_means_the_same_on_every_api():
    """``device=``: None the best-ranked, an index (int or digits), a kind word, a name part."""
    from gpumnn.backends.device_choice import choose_device
    names = ["llvmpipe (LLVM 15)", "NVIDIA H100 80GB HBM3", "NVIDIA RTX 4090"]
    assert choose_device(None, names, "Test") == 0
    assert choose_device(None, names, "Test", ranks=[3, 0, 0]) == 1
    assert choose_device(2, names, "Test") == choose_device("2", names, "Test") == 2
    assert choose_device("rtx", names, "Test") == 2
    assert choose_device("gpu", names, "Test", kinds={"gpu": [1, 2], "cpu": [0]}) == 1
    with pytest.raises(RuntimeError, match=r"Test device index 5 out of range; devices: 0: llvmpipe"):
        choose_device(5, names, "Test")
    with pytest.raises(KeyError, match="no Test device matches 'a100'"):
        choose_device("a100", names, "Test", error=KeyError)
    with pytest.raises(RuntimeError, match="no Test device of kind 'accelerator'"):
        choose_device("accelerator", names, "Test", kinds={"accelerator": []})
