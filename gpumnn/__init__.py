"""gpumnn: one ONNX model on five compute APIs behind one Backend interface, after MNN.

    import gpumnn
    net = gpumnn.load("resnet18.onnx")
    sess = net.session(backend="cpu", input_shapes={"input": (1, 3, 224, 224)})
    outputs = sess.run({"input": x})
"""
from .backends import available_backends, probe
from .errors import (BackendUnavailableError, DeviceArrayError, DeviceLostError, GpumnnError, InputError, InternalError, ModelError, ResourceError, SessionClosedError,
                     UnknownBackendError, UnsupportedOpError)
from .geometry import supported_ops
from .net import Net, load
from .runtime.session import Session

__version__ = "0.1.0"

__all__ = ["load", "Net", "Session", "available_backends", "probe", "supported_ops", "GpumnnError", "ModelError",
           "UnsupportedOpError", "InternalError", "InputError", "DeviceArrayError", "DeviceLostError", "BackendUnavailableError", "ResourceError", "SessionClosedError",
           "UnknownBackendError",
           "__version__"]
