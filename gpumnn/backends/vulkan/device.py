"""A thin layer over the ``vulkan`` (cffi) package: instance, device, queue, memory, buffers.

Only what a compute-only inference engine needs: one compute queue, storage buffers (device-local
for tensors and weights, host-visible coherent staging for transfers), one command pool per backend
for its recordings, :class:`SubmitLane` s (command pool, fence) for submissions from several
threads, descriptor pools that grow on demand, and an optional VK_LAYER_KHRONOS_validation layer
whose messages are collected in ``messages``.

Sharing: the instance, the logical device, its queue, the pipeline layouts and the compiled
pipelines live in a :class:`SharedDevice` that every backend asking for the same device uses
(:func:`acquire`); each backend has its own :class:`VulkanDevice` (command pool) and lanes on top.
A shared device whose last backend closes is kept, with its pipelines (at most
``MAX_PIPELINES`` unused ones, least recently used dropped first), for the next backend, and
destroyed at interpreter exit or by :func:`release_idle_devices`. Why: creating a device and
compiling pipelines per session costs 0.3-1 s and, on Mesa's lavapipe, about 40 KiB of resident
memory per session that the driver never returns (measured with 1,000 sessions, bench/soak.py).
The queue is shared, so submissions take the shared device's ``queue_lock``.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import vulkan as vk

from ...errors import DeviceLostError
from .. import deferred
from ..device_choice import choose_device
from ..kernels.glsl.coopmat import PRODUCT_TYPES, CooperativeMatrixShape, CooperativeMatrixSupport
from ..speed import CPU_DEVICE_COMPUTE_UNITS, GPU_DEFAULT_COMPUTE_UNITS
from ..waits import hang_reason

ffi = vk.ffi
lib = vk.lib

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
_DEVICE_TYPE_RANK = {
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0,
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1,
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: 2,
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: 3,
}
DEVICE_TYPE_NAMES = {
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete GPU",
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: "integrated GPU",
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual GPU",
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "CPU",
}
_ids = itertools.count(1)
#: compiled pipelines a shared device keeps when no backend uses them (least recently used go first)
MAX_PIPELINES = 256
#: the device extension of shaders' integer dot products (SPV_KHR_integer_dot_product), core in 1.3
INTEGER_DOT_EXTENSION = "VK_KHR_shader_integer_dot_product"

#: the first VK_LAYER_KHRONOS_validation (its specVersion) that knows VK_KHR_cooperative_matrix (1.3.255);
#: under an older one the cooperative-matrix GEMM stays off
COOPERATIVE_MATRIX_LAYER = vk.VK_MAKE_VERSION(1, 3, 255)
#: VkComponentTypeKHR values by the names gpumnn gives them (the cooperative-matrix query)
_COMPONENT_TYPES = {vk.VK_COMPONENT_TYPE_FLOAT16_KHR: "float16", vk.VK_COMPONENT_TYPE_FLOAT32_KHR: "float32",
                    vk.VK_COMPONENT_TYPE_FLOAT64_KHR: "float64", vk.VK_COMPONENT_TYPE_SINT8_KHR: "int8",
                    vk.VK_COMPONENT_TYPE_UINT8_KHR: "uint8", vk.VK_COMPONENT_TYPE_SINT32_KHR: "int32",
                    vk.VK_COMPONENT_TYPE_UINT32_KHR: "uint32", vk.VK_COMPONENT_TYPE_SINT16_KHR: "int16",
                    vk.VK_COMPONENT_TYPE_UINT16_KHR: "uint16"}


def cooperative_matrix_shapes(properties) -> tuple[CooperativeMatrixShape, ...]:
    """The VkCooperativeMatrixPropertiesKHR entries a device lists, as shapes (component types
    gpumnn has no name for keep their number)."""
    scopes = {vk.VK_SCOPE_SUBGROUP_KHR: "subgroup", vk.VK_SCOPE_WORKGROUP_KHR: "workgroup",
              vk.VK_SCOPE_DEVICE_KHR: "device", vk.VK_SCOPE_QUEUE_FAMILY_KHR: "queue family"}
    name = lambda t: _COMPONENT_TYPES.get(int(t), f"type {int(t)}")  # noqa: E731
    return tuple(CooperativeMatrixShape(int(p.MSize), int(p.NSize), int(p.KSize), name(p.AType), name(p.BType),
                                        name(p.CType), name(p.ResultType), scopes.get(int(p.scope), str(int(p.scope))))
                 for p in properties)


def describe_cooperative_matrices(shapes: tuple[CooperativeMatrixShape, ...], why_none: str) -> str:
    """What ``gpumnn info`` says of a device's cooperative matrices: the float products a GEMM
    could use (float16 x float16 summing into float32, float32 x float32), or why there are none."""
    if not shapes:
        return f"none ({why_none})"
    floats = [s for s in shapes if (s.a, s.b, s.c, s.result) in PRODUCT_TYPES.values()]
    listed = ", ".join(map(str, floats)) or "no float16*float16+float32 or float32 products"
    return f"VK_KHR_cooperative_matrix {listed} ({len(shapes)} shapes in all)"


class VulkanError(RuntimeError):
    """A Vulkan call failed or the device cannot do what gpumnn needs."""


def _check(result: int, what: str) -> None:
    if result != vk.VK_SUCCESS:
        exc = vk.exception_codes.get(result)
        raise VulkanError(f"{what} failed with VkResult {result} ({getattr(exc, '__name__', '?')})")


def _cstring(chars) -> str:
    if isinstance(chars, str):
        return chars
    if isinstance(chars, bytes):
        return chars.decode("utf-8", "replace")
    return ffi.string(chars).decode("utf-8", "replace")


def _debug_callback(severity, types, data, user_data):
    """Debug-utils messenger callback: appends a line to the ``messages`` of every backend on the device."""
    try:
        owner = ffi.from_handle(user_data)
        level = ("ERROR" if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT else
                 "WARNING" if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT else
                 "INFO" if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_INFO_BIT_EXT else "VERBOSE")
        ident = _cstring(data.pMessageIdName) if data.pMessageIdName != ffi.NULL else ""
        text = _cstring(data.pMessage) if data.pMessage != ffi.NULL else ""
        message = f"[{level}] {ident}: {text}"
        for listener in list(owner.listeners):  # each open backend's own list (VulkanDevice.messages)
            listener.append(message)
    except Exception:  # never let an exception cross the C boundary
        pass
    return 0


def validation_layer_available() -> bool:
    """Whether VK_LAYER_KHRONOS_validation and VK_EXT_debug_utils can be enabled here."""
    try:
        layers = {_cstring(l.layerName) for l in vk.vkEnumerateInstanceLayerProperties()}
        extensions = {_cstring(e.extensionName) for e in vk.vkEnumerateInstanceExtensionProperties(None)}
    except Exception:
        return False
    return VALIDATION_LAYER in layers and "VK_EXT_debug_utils" in extensions


@dataclass(eq=False)
class DeviceBuffer:
    """A VkBuffer with its own VkDeviceMemory; ``mapped`` is a persistent uint8 view or None."""

    handle: Any
    memory: Any
    size: int  # bytes
    kind: str  # "pool", "constant", "arena", "staging", "table"
    host_visible: bool
    mapped: np.ndarray | None = None
    id: int = field(default_factory=lambda: next(_ids))
    alive: bool = True

    def __repr__(self) -> str:
        return f"<DeviceBuffer #{self.id} {self.kind} {self.size} B>"


#: VkResult VK_ERROR_OUT_OF_POOL_MEMORY. The ``vulkan`` package (1.3.275.1) lists it as +1000069000,
#: so the -1000069000 a driver returns is not in its table of exceptions and surfaces as a KeyError
#: of that code. NVIDIA's driver returns it when a pool's ``maxSets`` are spent; lavapipe never did.
OUT_OF_POOL_MEMORY = -1000069000


def _pool_exhausted(exc: Exception) -> bool:
    """Whether ``exc`` is a descriptor pool's "no room left" (retry with a new pool)."""
    if isinstance(exc, (vk.VkErrorOutOfPoolMemory, vk.VkErrorFragmentedPool)):
        return True
    return isinstance(exc, KeyError) and exc.args == (OUT_OF_POOL_MEMORY,)


class DescriptorAllocator:
    """Descriptor sets of storage buffers from pools that are added when one runs out."""

    SETS_PER_POOL = 512

    def __init__(self, device, max_bindings: int, freeable: bool):
        self.device = device
        self.max_bindings = max_bindings
        self.flags = vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT if freeable else 0
        self.pools: list[Any] = []

    def _new_pool(self):
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       descriptorCount=self.SETS_PER_POOL * self.max_bindings)
        info = vk.VkDescriptorPoolCreateInfo(flags=self.flags, maxSets=self.SETS_PER_POOL,
                                             poolSizeCount=1, pPoolSizes=[size])
        self.pools.append(vk.vkCreateDescriptorPool(self.device, info, None))

    def allocate(self, set_layout) -> tuple[Any, Any]:
        """(descriptor set, the pool it came from)."""
        for attempt in range(2):
            if not self.pools or attempt == 1:
                self._new_pool()
            info = vk.VkDescriptorSetAllocateInfo(descriptorPool=self.pools[-1], descriptorSetCount=1,
                                                  pSetLayouts=[set_layout])
            try:
                return vk.vkAllocateDescriptorSets(self.device, info)[0], self.pools[-1]
            except Exception as exc:  # noqa: BLE001 -- only a full pool is retried
                if not _pool_exhausted(exc):
                    raise
                continue
        raise VulkanError("cannot allocate a descriptor set")

    def free(self, pool, dset) -> None:
        if self.flags:
            vk.vkFreeDescriptorSets(self.device, pool, 1, [dset])

    def reset(self) -> None:
        for pool in self.pools:
            vk.vkResetDescriptorPool(self.device, pool, 0)

    def destroy(self) -> None:
        for pool in self.pools:
            vk.vkDestroyDescriptorPool(self.device, pool, None)
        self.pools.clear()


@dataclass(eq=False)
class Pipeline:
    """A compute pipeline with its shader module, layout and cache key."""

    handle: Any
    module: Any
    layout: Any
    nbind: int
    key: tuple


class SharedDevice:
    """Instance + one physical device + logical device with one compute queue, shared by the
    backends that ask for the same device, with the layouts and pipelines worth keeping."""

    def __init__(self, device: str | int | None = None, validation: bool = False):
        self.listeners: list[list[str]] = []  # the ``messages`` of the backends using this device
        self._handle = ffi.new_handle(self)
        self.validation = False
        self.validation_layer_version = 0  # specVersion of VK_LAYER_KHRONOS_validation where enabled
        self.instance = None
        self.messenger = None
        self.device = None
        self.pipeline_cache = None
        self.users = 0  # backends using this device (the registry's lock guards it)
        self.allocated = 0  # bytes of device memory gpumnn's backends hold on this device now
        self.allocated_lock = threading.Lock()
        self.lost = False  # a submission failed with VK_ERROR_DEVICE_LOST or hung: never hand it out again
        self.lost_reason: str | None = None  # why, for the calls that fail fast afterwards
        self.hung = False  # lost by a submission that never finished: its objects are never freed
        #: releases finalizers queued (a dropped session's backends), done at the device's safe points
        self.deferred = deferred.DeferredReleases("vulkan")
        self.queue_lock = threading.Lock()  # vkQueueSubmit / vkQueueWaitIdle need it (one queue)
        # layouts and pipelines; re-entrant: a garbage-collected session's finalizer may close a
        # backend (release_pipelines) inside pipeline(), on the same thread, while it holds the lock
        self._lock = threading.RLock()
        self._layouts: dict[int, tuple[Any, Any]] = {}  # bindings -> (set layout, pipeline layout)
        self._pipelines: OrderedDict[tuple, list] = OrderedDict()  # key -> [Pipeline, users]
        self._create_instance(validation)
        try:
            self._choose_physical_device(device)
            self._create_device()
        except BaseException:
            self.destroy()
            raise

    # -- creation ----------------------------------------------------------------------------
    def _create_instance(self, validation: bool) -> None:
        layers: list[str] = []
        extensions: list[str] = []
        available_ext = {_cstring(e.extensionName) for e in vk.vkEnumerateInstanceExtensionProperties(None)}
        flags = 0
        if "VK_KHR_portability_enumeration" in available_ext:  # MoltenVK and friends
            extensions.append("VK_KHR_portability_enumeration")
            flags |= getattr(vk, "VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR", 1)
        if validation:
            layer_versions = {_cstring(l.layerName): int(l.specVersion) for l in vk.vkEnumerateInstanceLayerProperties()}
            available_layers = set(layer_versions)
            self.validation_layer_version = layer_versions.get(VALIDATION_LAYER, 0)
            if VALIDATION_LAYER not in available_layers:
                raise VulkanError(f"validation requested but {VALIDATION_LAYER} is not installed "
                                  "(Debian/Ubuntu package 'vulkan-validationlayers')")
            if "VK_EXT_debug_utils" not in available_ext:
                raise VulkanError("validation requested but VK_EXT_debug_utils is not available")
            layers.append(VALIDATION_LAYER)
            extensions.append("VK_EXT_debug_utils")
        app = vk.VkApplicationInfo(pApplicationName="gpumnn", applicationVersion=1, pEngineName="gpumnn",
                                   engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))
        info = vk.VkInstanceCreateInfo(flags=flags, pApplicationInfo=app,
                                       enabledLayerCount=len(layers), ppEnabledLayerNames=layers or None,
                                       enabledExtensionCount=len(extensions),
                                       ppEnabledExtensionNames=extensions or None)
        self.instance = vk.vkCreateInstance(info, None)
        if validation:
            self.validation = True
            create = vk.vkGetInstanceProcAddr(self.instance, "vkCreateDebugUtilsMessengerEXT")
            self._destroy_messenger = vk.vkGetInstanceProcAddr(self.instance, "vkDestroyDebugUtilsMessengerEXT")
            minfo = vk.VkDebugUtilsMessengerCreateInfoEXT(
                messageSeverity=(vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
                                 | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT),
                messageType=(vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                             | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                             | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT),
                pfnUserCallback=_debug_callback, pUserData=self._handle)
            self.messenger = create(self.instance, minfo, None)

    def _choose_physical_device(self, device: str | int | None) -> None:
        devices = list(vk.vkEnumeratePhysicalDevices(self.instance))
        if not devices:
            raise VulkanError("the Vulkan loader found no physical device (no ICD installed? "
                              "on Debian/Ubuntu: mesa-vulkan-drivers provides lavapipe)")
        props = [vk.vkGetPhysicalDeviceProperties(d) for d in devices]
        names = [_cstring(p.deviceName) for p in props]
        if device is None:
            device = os.environ.get("GPUMNN_VULKAN_DEVICE") or None
        index = choose_device(device, names, "Vulkan", error=VulkanError,
                              ranks=[_DEVICE_TYPE_RANK.get(p.deviceType, 9) for p in props])
        self.physical = devices[index]
        self.props = props[index]
        self.name = names[index]
        self.device_type = self.props.deviceType
        self.type_name = DEVICE_TYPE_NAMES.get(self.device_type, "other")
        limits = self.props.limits
        self.max_storage_range = int(limits.maxStorageBufferRange)
        self.min_storage_align = int(limits.minStorageBufferOffsetAlignment)
        self.max_push_constants = int(limits.maxPushConstantsSize)
        self.max_group_count = tuple(int(limits.maxComputeWorkGroupCount[i]) for i in range(3))
        self.max_group_invocations = int(limits.maxComputeWorkGroupInvocations)
        self.max_shared_memory = int(limits.maxComputeSharedMemorySize)
        self.max_storage_buffers = int(limits.maxPerStageDescriptorStorageBuffers)  # bindings a shader may have
        self.memory = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.max_allocation = self._max_allocation()
        extensions = {_cstring(e.extensionName) for e in vk.vkEnumerateDeviceExtensionProperties(self.physical, None)}
        self.has_memory_budget = "VK_EXT_memory_budget" in extensions
        self.compute_units, self.compute_units_source = self._compute_units(extensions)
        self.cooperative_matrices, self.cooperative_matrices_why = self._cooperative_matrices(extensions)
        if self.max_push_constants < 128:
            raise VulkanError(f"{self.name}: maxPushConstantsSize {self.max_push_constants} < 128")

    def _compute_units(self, extensions: set[str]) -> tuple[int, str]:
        """(compute units, where the figure comes from): the SMs, CUs or shader cores that the
        vendor's property extension reports; ``CPU_DEVICE_COMPUTE_UNITS`` on a CPU device and
        ``GPU_DEFAULT_COMPUTE_UNITS`` on a GPU that reports none (the tiled GEMM sizes its tiles
        and splits K from it: gpumnn.backends.kernels.glsl.planner)."""
        if self.device_type == vk.VK_PHYSICAL_DEVICE_TYPE_CPU:
            return CPU_DEVICE_COMPUTE_UNITS, "a CPU device"
        queries = (
            ("VK_NV_shader_sm_builtins", vk.VkPhysicalDeviceShaderSMBuiltinsPropertiesNV,
             lambda p: int(p.shaderSMCount), "shaderSMCount"),
            ("VK_AMD_shader_core_properties", vk.VkPhysicalDeviceShaderCorePropertiesAMD,
             lambda p: int(p.shaderEngineCount) * int(p.shaderArraysPerEngineCount) * int(p.computeUnitsPerShaderArray),
             "shaderEngineCount x shaderArraysPerEngineCount x computeUnitsPerShaderArray"),
            ("VK_ARM_shader_core_builtins", vk.VkPhysicalDeviceShaderCoreBuiltinsPropertiesARM,
             lambda p: int(p.shaderCoreCount), "shaderCoreCount"))
        for extension, struct, count, field_name in queries:
            if extension not in extensions or self.props.apiVersion < vk.VK_MAKE_VERSION(1, 1, 0):
                continue
            try:
                props = struct()
                vk.vkGetPhysicalDeviceProperties2(self.physical, vk.VkPhysicalDeviceProperties2(pNext=props))
                units = count(props)
            except Exception:  # noqa: BLE001 -- a loader without the query: the next source
                continue
            if units > 0:
                return units, f"{extension} {field_name}"
        return GPU_DEFAULT_COMPUTE_UNITS, "default: the driver reports none"

    def _cooperative_matrices(self, extensions: set[str]) -> tuple[tuple[CooperativeMatrixShape, ...], str]:
        """(the products the device's cooperative matrices compute, why there are none where none)."""
        if "VK_KHR_cooperative_matrix" not in extensions:
            return (), "the driver reports no VK_KHR_cooperative_matrix"
        try:
            query = vk.vkGetInstanceProcAddr(self.instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
            shapes = cooperative_matrix_shapes(query(self.physical))
        except Exception as exc:  # noqa: BLE001 -- a loader without the query: reported, not fatal
            return (), f"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR failed: {type(exc).__name__}: {exc}"
        return shapes, "" if shapes else "VK_KHR_cooperative_matrix lists no shapes"

    def _create_device(self) -> None:
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT and f.queueCount > 0]
        if not compute:
            raise VulkanError(f"{self.name} has no compute queue")
        self.queue_family = compute[0]
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0])
        dev_ext = {_cstring(e.extensionName) for e in vk.vkEnumerateDeviceExtensionProperties(self.physical, None)}
        extensions = ["VK_KHR_portability_subset"] if "VK_KHR_portability_subset" in dev_ext else []
        features = self._integer_dot_features(dev_ext, self._narrow_storage_features(dev_ext))
        if 1 in self.native_narrow:
            extensions.append("VK_KHR_8bit_storage")
        if self.integer_dot:
            extensions.append(INTEGER_DOT_EXTENSION)
        cooperative, cooperative_extensions = self._cooperative_matrix_features(dev_ext, features)

        def create(chain, names):
            info = vk.VkDeviceCreateInfo(pNext=chain, queueCreateInfoCount=1, pQueueCreateInfos=[qinfo],
                                         enabledExtensionCount=len(names), ppEnabledExtensionNames=names or None)
            return vk.vkCreateDevice(self.physical, info, None)

        try:
            self.device = create(cooperative, extensions + cooperative_extensions)
        except Exception as exc:  # noqa: BLE001 -- a driver that refuses them: the device without them
            if not cooperative_extensions:
                raise
            self.cooperative_support = dataclasses.replace(
                self.cooperative_support, missing=f"vkCreateDevice failed with them enabled ({type(exc).__name__}: {exc})")
            self.device = create(features, extensions)
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        #: bits of a timestamp the compute queue writes (0: no timestamps) and ns per tick
        self.timestamp_bits = int(families[self.queue_family].timestampValidBits)
        self.timestamp_period = float(self.props.limits.timestampPeriod)
        self.driver = self._describe_driver()
        self.pipeline_cache = vk.vkCreatePipelineCache(self.device, vk.VkPipelineCacheCreateInfo(), None)

    def _narrow_storage_features(self, dev_ext: set[str]) -> Any:
        """The feature structs that enable 8- and 16-bit elements in storage buffers where the
        device has them (VK_KHR_8bit_storage's storageBuffer8BitAccess; storageBuffer16BitAccess,
        core in Vulkan 1.1), chained for VkDeviceCreateInfo.pNext (None: neither); sets
        ``native_narrow`` (the element sizes held natively) and ``narrow_storage`` (per size,
        the feature that decided)."""
        self.native_narrow: frozenset[int] = frozenset()
        self._feature_structs: list = []  # referenced until the device is created (pNext holds raw pointers)
        has_8bit_ext = "VK_KHR_8bit_storage" in dev_ext
        if self.props.apiVersion < vk.VK_MAKE_VERSION(1, 1, 0):
            self.narrow_storage = {size: f"packed: the device implements Vulkan {self.api_version}, below 1.1"
                                   for size in (1, 2)}
            return None
        query8 = vk.VkPhysicalDevice8BitStorageFeatures()
        query16 = vk.VkPhysicalDevice16BitStorageFeatures(pNext=query8 if has_8bit_ext else None)
        vk.vkGetPhysicalDeviceFeatures2(self.physical, vk.VkPhysicalDeviceFeatures2(pNext=query16))
        has8 = has_8bit_ext and bool(query8.storageBuffer8BitAccess)
        has16 = bool(query16.storageBuffer16BitAccess)
        self.native_narrow = frozenset(size for size, native in ((1, has8), (2, has16)) if native)
        self.narrow_storage = {
            1: ("native: VK_KHR_8bit_storage storageBuffer8BitAccess" if has8 else
                "packed: no VK_KHR_8bit_storage" if not has_8bit_ext else
                "packed: VK_KHR_8bit_storage without storageBuffer8BitAccess"),
            2: ("native: storageBuffer16BitAccess of VK_KHR_16bit_storage, core in Vulkan 1.1" if has16 else
                "packed: no storageBuffer16BitAccess")}
        chain = None
        if has8:
            chain = vk.VkPhysicalDevice8BitStorageFeatures(storageBuffer8BitAccess=vk.VK_TRUE)
            self._feature_structs.append(chain)
        if has16:
            chain = vk.VkPhysicalDevice16BitStorageFeatures(pNext=chain, storageBuffer16BitAccess=vk.VK_TRUE)
            self._feature_structs.append(chain)
        return chain

    def _integer_dot_features(self, dev_ext: set[str], chain: Any) -> Any:
        """``chain`` with the feature struct that enables shaders' integer dot products
        (VK_KHR_shader_integer_dot_product's shaderIntegerDotProduct, core in Vulkan 1.3) in front
        where the device has them; sets ``integer_dot`` (the instructions the int8 GEMM uses, ""
        for none) and ``integer_dot_missing`` (why none)."""
        self.integer_dot, self.integer_dot_missing = "", ""
        if INTEGER_DOT_EXTENSION not in dev_ext or self.props.apiVersion < vk.VK_MAKE_VERSION(1, 1, 0):
            self.integer_dot_missing = f"no {INTEGER_DOT_EXTENSION}"
            return chain
        query = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures()
        vk.vkGetPhysicalDeviceFeatures2(self.physical, vk.VkPhysicalDeviceFeatures2(pNext=query))
        if not query.shaderIntegerDotProduct:
            self.integer_dot_missing = f"{INTEGER_DOT_EXTENSION} without shaderIntegerDotProduct"
            return chain
        props = vk.VkPhysicalDeviceShaderIntegerDotProductProperties()
        vk.vkGetPhysicalDeviceProperties2(self.physical, vk.VkPhysicalDeviceProperties2(pNext=props))
        accelerated = (props.integerDotProduct4x8BitPackedMixedSignednessAccelerated
                       and props.integerDotProduct4x8BitPackedSignedAccelerated)
        self.integer_dot = (f"{INTEGER_DOT_EXTENSION} (OpSUDot / OpSDot on 4x8-bit packed words, "
                            f"{'accelerated' if accelerated else 'not accelerated'} by the driver)")
        enable = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(pNext=chain, shaderIntegerDotProduct=vk.VK_TRUE)
        self._feature_structs.append(enable)
        return enable

    def _cooperative_matrix_features(self, dev_ext: set[str], chain: Any) -> tuple[Any, list[str]]:
        """(``chain`` with the feature structs of the cooperative-matrix GEMM in front, the device
        extensions to enable with them) where the device has everything gemm_coopmat.glsl needs:
        VK_KHR_cooperative_matrix's ``cooperativeMatrix`` in compute shaders, the Vulkan memory
        model (VK_KHR_vulkan_memory_model), basic subgroup operations in compute shaders, and
        ``shaderFloat16`` (VK_KHR_shader_float16_int8) for float16 tiles where it has that too;
        (``chain``, []) otherwise. Sets ``cooperative_support`` (``missing`` says why not)."""
        def support(missing: str, subgroup_size: int = 0, float16: bool = False) -> None:
            self.cooperative_support = CooperativeMatrixSupport(
                self.cooperative_matrices, subgroup_size, self.max_shared_memory, self.max_group_invocations,
                float16, missing)

        if not self.cooperative_matrices:
            support(self.cooperative_matrices_why)
            return chain, []
        layer = self.validation_layer_version
        if layer and layer < COOPERATIVE_MATRIX_LAYER:  # it would report the feature structs it does not know
            support(f"the validation layer ({layer >> 22}.{(layer >> 12) & 0x3ff}.{layer & 0xfff}) predates "
                    "VK_KHR_cooperative_matrix")
            return chain, []
        extensions = ["VK_KHR_cooperative_matrix", "VK_KHR_vulkan_memory_model"]
        absent = [name for name in extensions if name not in dev_ext]
        if absent:
            support(f"the driver lists no {' or '.join(absent)}")
            return chain, []
        has_float16_extension = "VK_KHR_shader_float16_int8" in dev_ext
        try:
            query_matrix = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR()
            query_model = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(pNext=query_matrix)
            query_float16 = (vk.VkPhysicalDeviceShaderFloat16Int8Features(pNext=query_model)
                             if has_float16_extension else None)
            vk.vkGetPhysicalDeviceFeatures2(self.physical, vk.VkPhysicalDeviceFeatures2(pNext=query_float16 or query_model))
            matrix_props = vk.VkPhysicalDeviceCooperativeMatrixPropertiesKHR()
            subgroup = vk.VkPhysicalDeviceSubgroupProperties(pNext=matrix_props)
            vk.vkGetPhysicalDeviceProperties2(self.physical, vk.VkPhysicalDeviceProperties2(pNext=subgroup))
        except Exception as exc:  # noqa: BLE001 -- a loader or binding without the queries: reported, not fatal
            support(f"querying the cooperative-matrix features failed ({type(exc).__name__}: {exc})")
            return chain, []
        compute = vk.VK_SHADER_STAGE_COMPUTE_BIT
        subgroup_size = int(subgroup.subgroupSize)
        float16 = bool(query_float16 is not None and query_float16.shaderFloat16)
        lacking = [name for name, present in (
            ("cooperativeMatrix", query_matrix.cooperativeMatrix), ("vulkanMemoryModel", query_model.vulkanMemoryModel),
            ("compute shaders in cooperativeMatrixSupportedStages", matrix_props.cooperativeMatrixSupportedStages & compute),
            ("compute shaders in the subgroups' supportedStages", subgroup.supportedStages & compute),
            ("basic subgroup operations", subgroup.supportedOperations & vk.VK_SUBGROUP_FEATURE_BASIC_BIT))
            if not present]
        if lacking:
            support(f"the device lacks {', '.join(lacking)}", subgroup_size, float16)
            return chain, []
        enable = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(pNext=chain, cooperativeMatrix=vk.VK_TRUE)
        self._feature_structs.append(enable)
        enable = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(pNext=enable, vulkanMemoryModel=vk.VK_TRUE)
        self._feature_structs.append(enable)
        if float16:
            enable = vk.VkPhysicalDeviceShaderFloat16Int8Features(pNext=enable, shaderFloat16=vk.VK_TRUE)
            self._feature_structs.append(enable)
            extensions.append("VK_KHR_shader_float16_int8")
        support("", subgroup_size, float16)
        return enable, extensions

    @property
    def api_version(self) -> str:
        v = int(self.props.apiVersion)
        return f"{v >> 22}.{(v >> 12) & 0x3ff}"

    def _describe_driver(self) -> str:
        """The API version the device implements, the driver's name and version text
        (VkPhysicalDeviceDriverProperties, Vulkan 1.2) where it says, and driverVersion (encoded
        by each vendor its own way, so shown raw)."""
        api = self.props.apiVersion
        text = f"Vulkan {vk.VK_VERSION_MAJOR(api)}.{vk.VK_VERSION_MINOR(api)}.{vk.VK_VERSION_PATCH(api)}"
        try:
            props = vk.VkPhysicalDeviceDriverProperties()
            vk.vkGetPhysicalDeviceProperties2(self.physical, vk.VkPhysicalDeviceProperties2(pNext=props))
            name, info = _cstring(props.driverName), _cstring(props.driverInfo)
            if name:
                text += f"; {name} {info}".rstrip()
        except Exception:  # noqa: BLE001 -- a Vulkan 1.0 device without the query: the version alone
            pass
        return f"{text}; driverVersion {int(self.props.driverVersion):#x}"

    # -- memory limits -----------------------------------------------------------------------
    def _max_allocation(self) -> int:
        """maxMemoryAllocationSize (Vulkan 1.1 / VK_KHR_maintenance3); the largest device-local
        heap where the device cannot say."""
        heap = self.device_heap_size()
        try:
            maint3 = vk.VkPhysicalDeviceMaintenance3Properties()
            vk.vkGetPhysicalDeviceProperties2(self.physical, vk.VkPhysicalDeviceProperties2(pNext=maint3))
            value = int(maint3.maxMemoryAllocationSize)
            return min(value, heap) if value > 0 else heap
        except Exception:  # a 1.0 loader or driver
            return heap

    def device_heap_index(self) -> int:
        """The largest device-local memory heap (where pools and weights go)."""
        heaps = [(int(self.memory.memoryHeaps[i].size), i) for i in range(self.memory.memoryHeapCount)
                 if self.memory.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT]
        if not heaps:
            heaps = [(int(self.memory.memoryHeaps[i].size), i) for i in range(self.memory.memoryHeapCount)]
        return max(heaps)[1]

    def device_heap_size(self) -> int:
        return int(self.memory.memoryHeaps[self.device_heap_index()].size)

    def memory_budget(self) -> tuple[int, int] | None:
        """(budget, usage) of the device-local heap from VK_EXT_memory_budget, None without it."""
        if not self.has_memory_budget:
            return None
        try:
            budget = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT()
            vk.vkGetPhysicalDeviceMemoryProperties2(self.physical, vk.VkPhysicalDeviceMemoryProperties2(pNext=budget))
            index = self.device_heap_index()
            return int(budget.heapBudget[index]), int(budget.heapUsage[index])
        except Exception:
            return None

    # -- layouts and pipelines (shared by every backend on this device) ----------------------
    def layouts(self, nbind: int, push_bytes: int) -> tuple[Any, Any]:
        """(descriptor set layout, pipeline layout) for ``nbind`` storage buffers and
        ``push_bytes`` of push constants, created once per device."""
        with self._lock:
            entry = self._layouts.get(nbind)
            if entry is None:
                bindings = [vk.VkDescriptorSetLayoutBinding(
                    binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(nbind)]
                set_layout = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
                    bindingCount=nbind, pBindings=bindings), None)
                push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push_bytes)
                layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
                    setLayoutCount=1, pSetLayouts=[set_layout], pushConstantRangeCount=1,
                    pPushConstantRanges=[push]), None)
                entry = self._layouts[nbind] = (set_layout, layout)
            return entry

    def pipeline(self, key: tuple, nbind: int, push_bytes: int, spirv: Callable[[], bytes]) -> tuple[Pipeline, bool]:
        """The pipeline cached under ``key`` (one more user), built from ``spirv()`` if absent.
        Returns (pipeline, whether it was built now)."""
        layout = self.layouts(nbind, push_bytes)[1]
        with self._lock:
            entry = self._pipelines.get(key)
            if entry is not None:
                entry[1] += 1
                self._pipelines.move_to_end(key)
                return entry[0], False
            code = spirv()
            module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code),
                                             None)
            try:
                stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module,
                                                           pName="main")
                info = vk.VkComputePipelineCreateInfo(stage=stage, layout=layout, basePipelineIndex=-1)
                handle = vk.vkCreateComputePipelines(self.device, self.pipeline_cache, 1, [info], None)[0]
            except BaseException:
                vk.vkDestroyShaderModule(self.device, module, None)
                raise
            pipe = Pipeline(handle, module, layout, nbind, key)
            self._pipelines[key] = [pipe, 1]
            self._trim()
            return pipe, True

    def release_pipelines(self, keys) -> None:
        """A backend stops using the pipelines under ``keys``."""
        with self._lock:
            for key in keys:
                entry = self._pipelines.get(key)
                if entry is not None:
                    entry[1] -= 1
            self._trim()

    def _trim(self) -> None:
        unused = [key for key, (_, users) in self._pipelines.items() if users <= 0]
        for key in unused[:max(0, len(unused) - MAX_PIPELINES)]:  # oldest first
            pipe = self._pipelines.pop(key)[0]
            vk.vkDestroyPipeline(self.device, pipe.handle, None)
            vk.vkDestroyShaderModule(self.device, pipe.module, None)

    def mark_lost(self, reason: str, hung: bool = False) -> None:
        """The device is lost: later calls fail fast with ``reason`` and new backends get a fresh
        device. ``hung``: a submission never finished, so nothing on this device is ever waited
        for or destroyed again (work may still be in flight; freeing what it uses is undefined)."""
        self.lost = True
        self.hung = self.hung or hung
        self.lost_reason = self.lost_reason or reason

    def destroy(self) -> None:
        """Destroy everything (no backend may use this device any more). Idempotent; a lost
        device is left as it is (destroying objects a hung submission uses is undefined)."""
        if self.hung:
            return
        if self.device is not None:
            vk.vkDeviceWaitIdle(self.device)
            for pipe, _ in self._pipelines.values():
                vk.vkDestroyPipeline(self.device, pipe.handle, None)
                vk.vkDestroyShaderModule(self.device, pipe.module, None)
            self._pipelines.clear()
            for set_layout, layout in self._layouts.values():
                vk.vkDestroyPipelineLayout(self.device, layout, None)
                vk.vkDestroyDescriptorSetLayout(self.device, set_layout, None)
            self._layouts.clear()
            if self.pipeline_cache is not None:
                vk.vkDestroyPipelineCache(self.device, self.pipeline_cache, None)
                self.pipeline_cache = None
            vk.vkDestroyDevice(self.device, None)
            self.device = None
        if self.messenger is not None:
            self._destroy_messenger(self.instance, self.messenger, None)
            self.messenger = None
        if self.instance is not None:
            vk.vkDestroyInstance(self.instance, None)
            self.instance = None


_registry_lock = threading.Lock()
_shared: dict[tuple, SharedDevice] = {}


def _key(device: str | int | None, validation: bool) -> tuple:
    if device is None:
        device = os.environ.get("GPUMNN_VULKAN_DEVICE") or None
    return (None if device is None else str(device), bool(validation))


def acquire(device: str | int | None = None, validation: bool = False) -> SharedDevice:
    """The shared device for this device choice, created on first use; one more user."""
    key = _key(device, validation)
    shared = _shared.get(key)
    if shared is not None:
        shared.deferred.drain()  # a safe point: closes queued by finalizers run before a new backend starts
    with _registry_lock:
        shared = _shared.get(key)
        if shared is None or shared.lost:
            shared = SharedDevice(key[0], validation)
            _shared[key] = shared
        shared.users += 1
        return shared


def release(shared: SharedDevice) -> None:
    """One user less; a lost device is destroyed when nobody uses it, a healthy one is kept."""
    with _registry_lock:
        shared.users -= 1
        if shared.users <= 0 and shared.lost and shared not in _shared.values():
            shared.destroy()


def release_idle_devices() -> int:
    """Destroy every shared device no backend uses (with its pipelines); returns how many.
    Runs at interpreter exit; call it to give a device's memory back earlier."""
    for shared in list(_shared.values()):
        shared.deferred.drain()  # backends of dropped sessions close first (a safe point)
    with _registry_lock:
        idle = [(key, shared) for key, shared in _shared.items() if shared.users <= 0]
        for key, shared in idle:
            del _shared[key]
            shared.destroy()
        return len(idle)


deferred.on_exit(release_idle_devices)  # after every open session is closed (see deferred)


class VulkanDevice:
    """One backend's use of a :class:`SharedDevice`: its own command pool for recordings (Vulkan
    requires external synchronisation of each pool), the shared queue and limits."""

    #: what a backend reads of the shared device (copied: some are read on every run)
    SHARED = ("instance", "physical", "props", "name", "device_type", "type_name", "max_storage_range",
              "min_storage_align", "max_push_constants", "max_group_count", "max_group_invocations",
              "max_shared_memory", "max_storage_buffers", "memory", "device", "queue", "queue_family", "validation", "max_allocation",
              "timestamp_bits", "timestamp_period", "driver", "native_narrow", "narrow_storage", "compute_units",
              "integer_dot", "integer_dot_missing",
              "compute_units_source", "cooperative_matrices", "cooperative_matrices_why", "cooperative_support")

    def __init__(self, device: str | int | None = None, validation: bool = False):
        self.shared: SharedDevice | None = acquire(device, validation)
        shared = self.shared
        for name in self.SHARED:
            setattr(self, name, getattr(shared, name))
        self.submit_timeout = 120.0  # seconds (the backend sets the session's)
        self.messages: list[str] = []  # validation-layer messages since this backend started
        with _registry_lock:
            shared.listeners.append(self.messages)
        self.command_pool = None
        try:
            self.command_pool = self.create_command_pool()
        except BaseException:
            self.close()
            raise

    def create_command_pool(self):
        pool_info = vk.VkCommandPoolCreateInfo(flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                               queueFamilyIndex=self.queue_family)
        return vk.vkCreateCommandPool(self.device, pool_info, None)

    # -- memory ------------------------------------------------------------------------------
    def memory_type(self, type_bits: int, required: int, preferred: int = 0) -> int:
        best, best_score = -1, -1
        for i in range(self.memory.memoryTypeCount):
            flags = self.memory.memoryTypes[i].propertyFlags
            if not (type_bits >> i) & 1 or (flags & required) != required:
                continue
            score = bin(flags & preferred).count("1")
            if score > best_score:
                best, best_score = i, score
        return best

    def memory_flags(self, index: int) -> int:
        return int(self.memory.memoryTypes[index].propertyFlags)

    def create_buffer(self, size: int, kind: str, host_visible: bool, prefer_device_local: bool = True) -> DeviceBuffer:
        """A storage + transfer buffer. ``host_visible`` demands mappable coherent memory."""
        size = max(int(size), 16)
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        handle = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(
            size=size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(self.device, handle)
        host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        if host_visible:
            preferred = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
            if prefer_device_local:
                preferred |= vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
            index = self.memory_type(req.memoryTypeBits, host, preferred)
        else:
            index = self.memory_type(req.memoryTypeBits, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
            if index < 0:
                index = self.memory_type(req.memoryTypeBits, 0)
        if index < 0:
            vk.vkDestroyBuffer(self.device, handle, None)
            raise VulkanError(f"{self.name}: no memory type for a {kind} buffer")
        try:
            memory = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(
                allocationSize=req.size, memoryTypeIndex=index), None)
        except vk.VkException as exc:
            vk.vkDestroyBuffer(self.device, handle, None)
            raise VulkanError(f"{self.name}: cannot allocate {size} bytes for a {kind} buffer "
                              f"({type(exc).__name__})") from exc
        vk.vkBindBufferMemory(self.device, handle, memory, 0)
        with self.shared.allocated_lock:
            self.shared.allocated += size
        flags = self.memory_flags(index)
        mappable = (flags & host) == host
        buf = DeviceBuffer(handle, memory, size, kind, mappable)
        if mappable:
            raw = vk.vkMapMemory(self.device, memory, 0, size, 0)
            buf.mapped = np.frombuffer(raw, dtype=np.uint8, count=size)
        return buf

    def destroy_buffer(self, buf: DeviceBuffer) -> None:
        if not buf.alive:
            return
        buf.alive = False
        if buf.mapped is not None:
            buf.mapped = None
            vk.vkUnmapMemory(self.device, buf.memory)
        vk.vkDestroyBuffer(self.device, buf.handle, None)
        vk.vkFreeMemory(self.device, buf.memory, None)
        if self.shared is not None:
            with self.shared.allocated_lock:
                self.shared.allocated -= buf.size

    # -- commands ----------------------------------------------------------------------------
    def allocate_command_buffer(self, pool=None):
        """A primary command buffer from ``pool`` (default: this backend's pool for recordings,
        used only under the backend's lock)."""
        info = vk.VkCommandBufferAllocateInfo(commandPool=pool or self.command_pool,
                                              level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1)
        return vk.vkAllocateCommandBuffers(self.device, info)[0]

    def free_command_buffer(self, cmd, pool=None) -> None:
        vk.vkFreeCommandBuffers(self.device, pool or self.command_pool, 1, [cmd])

    def _check_lost(self, result: int) -> None:
        if result == vk.VK_ERROR_DEVICE_LOST and self.shared is not None:
            self.shared.mark_lost(f"{self.name}: the driver reported VK_ERROR_DEVICE_LOST")
            raise DeviceLostError(f"vulkan backend: {self.shared.lost_reason}")

    def check_alive(self) -> None:
        """DeviceLostError, with the reason, when the shared device was marked lost."""
        shared = self.shared
        if shared is not None and shared.lost_reason is not None:
            raise DeviceLostError(f"vulkan backend: the device is lost: {shared.lost_reason}")

    def wait_idle(self) -> None:
        """Wait until the shared queue has finished everything submitted (not on a lost device)."""
        shared = self.shared
        if shared is not None and not shared.hung and shared.device is not None:
            with shared.queue_lock:
                vk.vkQueueWaitIdle(self.queue)

    def close(self) -> None:
        """Destroy this backend's command pool (with its command buffers), and stop
        using the shared device (which stays, for the next backend; see the module docstring)."""
        shared, self.shared = self.shared, None
        if shared is None:
            return
        with _registry_lock:
            shared.listeners = [listener for listener in shared.listeners if listener is not self.messages]
        try:
            if self.command_pool is not None and not shared.hung and shared.device is not None:
                with shared.queue_lock:
                    vk.vkQueueWaitIdle(self.queue)
                vk.vkDestroyCommandPool(self.device, self.command_pool, None)
            self.command_pool = None
        finally:
            release(shared)


class SubmitLane:
    """What one submission in flight needs for itself, so that several threads can submit at once.

    Vulkan leaves synchronisation to the caller: a command pool (and every command buffer from
    it, while recorded) and a fence may be used by one thread at a time, and the queue by one
    ``vkQueueSubmit`` at a time. A lane owns a command pool with one reusable transfer command
    buffer, a fence and a prebuilt submit-info; the (shared) queue is held only for the submit
    itself, and the wait on the lane's own fence runs without any lock. The backend keeps a few
    lanes and lends one per write, read or run (see ``VulkanBackend._lane``).
    """

    def __init__(self, dev: VulkanDevice):
        self.dev = dev
        self.command_pool = dev.create_command_pool()
        self.fence = vk.vkCreateFence(dev.device, vk.VkFenceCreateInfo(), None)
        self._fences = ffi.new("VkFence[1]", [self.fence])
        self._submit = ffi.new("VkSubmitInfo*")
        self._submit.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        self._cmd_array = ffi.new("VkCommandBuffer[1]")
        self._submit.commandBufferCount = 1
        self._submit.pCommandBuffers = self._cmd_array
        self.transfer_cmd = self.allocate_command_buffer()
        self.staging: DeviceBuffer | None = None  # the backend's, grown on demand
        self.eager_descriptors: DescriptorAllocator | None = None  # likewise
        self._timestamps: _Timestamps | None = None  # made by the first timed submit
        self.in_flight = ""  # what the lane's last submission runs (named by a timeout)

    def allocate_command_buffer(self):
        return self.dev.allocate_command_buffer(self.command_pool)

    def free_command_buffer(self, cmd) -> None:
        self.dev.free_command_buffer(cmd, self.command_pool)

    def submit_and_wait(self, cmd, what: str = "a transfer") -> None:
        """One vkQueueSubmit of ``cmd`` signalling this lane's fence; wait and reset it. The
        shared queue is held for the submit only. ``what``: the ops it runs, for a timeout."""
        self.in_flight = what
        self._cmd_array[0] = cmd
        self._submit_and_wait(self._submit)

    def timed_submit(self, cmd, what: str = "a timed run") -> float:
        """``submit_and_wait`` of ``cmd`` between two timestamp queries, and the seconds between
        them: the device's own time for the command buffer (see :class:`_Timestamps`)."""
        if self._timestamps is None:
            self._timestamps = _Timestamps(self)
        stamps = self._timestamps
        stamps.cmds[1] = cmd
        self.in_flight = what
        self._submit_and_wait(stamps.submit)
        return stamps.seconds()

    def submit(self, cmd, what: str = "a run") -> None:
        """One vkQueueSubmit of ``cmd`` signalling this lane's fence, without waiting: ``wait``
        follows (the lane stays with its submitter until then)."""
        self.in_flight = what
        self._cmd_array[0] = cmd
        self._submit_only(self._submit)

    def _submit_and_wait(self, submit) -> None:
        self._submit_only(submit)
        self.wait()

    def _submit_only(self, submit) -> None:
        dev = self.dev
        dev.check_alive()
        with dev.shared.queue_lock:
            result = lib.vkQueueSubmit(dev.queue, 1, submit, self.fence)
        dev._check_lost(result)
        _check(result, "vkQueueSubmit")

    def wait(self) -> None:
        """Wait for this lane's fence (its last submission) and reset it. A submission that does
        not finish within the backend's ``submit_timeout`` marks the device lost and raises
        DeviceLostError naming the device and what was in flight (the lane is never reused)."""
        dev = self.dev
        timeout_ns = max(1, int(dev.submit_timeout * 1e9))
        result = lib.vkWaitForFences(dev.device, 1, self._fences, vk.VK_TRUE, timeout_ns)
        if result == vk.VK_TIMEOUT:
            self.hung = True
            reason = hang_reason(dev.name, dev.submit_timeout, self.in_flight)
            if dev.shared is not None:
                dev.shared.mark_lost(reason, hung=True)
            raise DeviceLostError(f"vulkan backend: {reason}")
        dev._check_lost(result)
        _check(result, "vkWaitForFences")
        _check(lib.vkResetFences(dev.device, 1, self._fences), "vkResetFences")

    hung = False  # its last submission timed out: never waited for, never destroyed

    def destroy(self) -> None:
        """Free the lane's own objects (its submissions must have finished; staging is the backend's)."""
        device = self.dev.device
        if self.eager_descriptors is not None:
            self.eager_descriptors.destroy()
        if self._timestamps is not None:
            vk.vkDestroyQueryPool(device, self._timestamps.pool, None)
        vk.vkDestroyFence(device, self.fence, None)
        vk.vkDestroyCommandPool(device, self.command_pool, None)


class _Timestamps:
    """Two timestamp queries of one lane around a command buffer, in one submission of three: a
    command buffer that resets the query pool and writes the first timestamp (top of pipe), the
    measured one, and one that writes the second (bottom of pipe: after every command submitted
    before it has finished). Both brackets are recorded once and replayed; the submit-info and
    the result array are made once too, so a timed submit allocates nothing."""

    def __init__(self, lane: SubmitLane):
        dev = lane.dev
        if not dev.timestamp_bits:
            raise VulkanError(f"{dev.name}: its compute queue writes no timestamps (timestampValidBits 0)")
        self._dev = dev
        self.pool = vk.vkCreateQueryPool(dev.device, vk.VkQueryPoolCreateInfo(
            queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2), None)
        begin, end = lane.allocate_command_buffer(), lane.allocate_command_buffer()
        vk.vkBeginCommandBuffer(begin, vk.VkCommandBufferBeginInfo())
        vk.vkCmdResetQueryPool(begin, self.pool, 0, 2)
        vk.vkCmdWriteTimestamp(begin, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.pool, 0)
        vk.vkEndCommandBuffer(begin)
        vk.vkBeginCommandBuffer(end, vk.VkCommandBufferBeginInfo())
        vk.vkCmdWriteTimestamp(end, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.pool, 1)
        vk.vkEndCommandBuffer(end)
        self.cmds = ffi.new("VkCommandBuffer[3]", [begin, ffi.NULL, end])
        self.submit = ffi.new("VkSubmitInfo*")
        self.submit.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        self.submit.commandBufferCount = 3
        self.submit.pCommandBuffers = self.cmds
        self._results = ffi.new("uint64_t[2]")
        self._mask = (1 << dev.timestamp_bits) - 1 if dev.timestamp_bits < 64 else (1 << 64) - 1

    def seconds(self) -> float:
        """The time between the two timestamps of the last (waited-for) submission."""
        dev = self._dev
        _check(lib.vkGetQueryPoolResults(dev.device, self.pool, 0, 2, 16, self._results, 8,
                                         vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT),
               "vkGetQueryPoolResults")
        ticks = (self._results[1] - self._results[0]) & self._mask
        return ticks * dev.timestamp_period * 1e-9
