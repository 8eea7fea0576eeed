"""What stack frames say: phases, module calls, categories, and the names of repeated calls."""

from __future__ import annotations

from memprof.categories import Category
from memprof.interop.frames import Label, ModuleCall, label, memprof_frames, module_calls, static_category
from memprof.interop.replay import replay
from memprof.interop.steps import plan_steps
from memprof.phases import Phase
from tests.memprof.interop.snapshots import (
    MODULE_PY,
    TORCH,
    Builder,
    backward_frames,
    forward_frames,
    frame,
    module_call,
    optimizer_frames,
    train_frames,
    weight_frames,
)

FC1 = ("/work/torch_nn/linear.py", 125, 31)


def test_each_rule():
    assert label([]).phase is None
    assert label(train_frames()) == label([frame("/work/x.py", 1, "f")]) == Label(Phase.OTHER)
    assert label(backward_frames()).phase == Phase.BACKWARD
    python_backward = [frame(f"{TORCH}/autograd/graph.py", 825, "_engine_run_backward"),
                       frame(f"{TORCH}/_tensor.py", 626, "backward"), *train_frames()]
    assert label(python_backward).phase == Phase.BACKWARD  # e.g. the loss's gradient, made on the main thread
    assert label(optimizer_frames()).phase == Phase.OPTIMIZER
    assert label(weight_frames()) == Label(Phase.OTHER, category=Category.WEIGHTS)
    init = [frame("/venv/torch/nn/modules/linear.py", 106, "__init__"), frame("/work/model.py", 12, "__init__")]
    assert label(init).category == Category.WEIGHTS
    found = label(forward_frames(FC1))
    assert found.phase == Phase.FORWARD and not found.exact
    assert found.calls == (ModuleCall("model@train:30", "model.py:forward"),
                           ModuleCall("linear@model:31", "linear.py:forward"))


def test_forward_with_cpp_frames_is_forward():
    """``stacks="all"`` adds C++ frames; a forward op passes through autograd's VariableType, not its engine."""
    cpp = [frame("??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"),
           frame("??", 0, "at::native::addmm_out_cuda_impl"),
           frame("??", 0, "torch::autograd::VariableType::(anonymous namespace)::addmm"),
           frame("??", 0, "torch::autograd::THPVariable_addmm")]
    assert label(cpp + forward_frames(FC1)).phase == Phase.FORWARD
    assert label(cpp + [frame("??", 0, "torch::autograd::generated::AddmmBackward0::apply")]).phase == Phase.BACKWARD


def test_recomputation_in_backward_is_backward():
    """Activation checkpointing runs module forwards inside backward: the allocation is backward's."""
    frames = forward_frames(FC1)[:4] + [frame(f"{TORCH}/utils/checkpoint.py", 1100, "unpack_hook")]
    assert module_calls([f for f in frames if f["filename"].endswith(".py")])
    assert label(frames).phase == Phase.BACKWARD


def test_module_calls_skip_hook_wrappers_and_windows_paths():
    frames = [frame("C:\\work\\blocks.py", 40, "forward"), frame(MODULE_PY, 1790, "inner"),
              *module_call(MODULE_PY, 1784)[1:], frame("C:\\work\\net.py", 77, "forward"),
              *module_call(MODULE_PY, 1784)[1:], frame("/work/train.py", 30, "train_step")]
    assert module_calls(frames) == (ModuleCall("net@train:30", "net.py:forward"),
                                    ModuleCall("blocks@net:77", "blocks.py:forward"))
    custom = [frame("/work/my.model.py", 9, "run"), *module_call(MODULE_PY, 1784)[1:], *train_frames()]
    assert module_calls(custom) == (ModuleCall("my_model-run@train:40", "my.model.py:run"),)


def test_memprof_frames_are_read_back_exactly():
    found = label(memprof_frames("grads", "backward", "blocks.0.attn", 7, "exit"))
    assert found.exact and found.iteration == 7 and found.phase == Phase.BACKWARD
    assert found.category == Category.GRADS
    assert [c.component for c in found.calls] == ["blocks", "0", "attn"]
    assert label(memprof_frames("other", "other", "", 0, "start")).calls == ()


def test_static_categories_of_blocks_the_trace_did_not_allocate():
    assert static_category(weight_frames()) == Category.WEIGHTS
    assert static_category(optimizer_frames()) == Category.OPTIMIZER_STATE
    assert static_category(backward_frames()) == Category.WEIGHT_GRADS
    assert static_category(forward_frames(FC1)) == Category.FEATURE_MAPS
    assert static_category(train_frames()) == static_category([]) == Category.OTHER


def test_calls_from_one_line_are_numbered_in_each_parent_call():
    """nn.Sequential calls every child from the same line: the second Linear is a second module."""
    loop = ("/work/torch_nn/container.py", 250, 40)
    b = Builder()
    b.segment_alloc(1 << 20)
    for _ in range(2):  # two forwards: the names repeat, they are not numbered on
        b.alloc(512, forward_frames(loop, ("/work/torch_nn/linear.py", 125, 250)))
        b.alloc(512, forward_frames(loop, ("/work/torch_nn/activation.py", 99, 250)))
        b.alloc(512, forward_frames(loop, ("/work/torch_nn/linear.py", 125, 250)))
        b.alloc(512, backward_frames())
    plan = plan_steps(replay(b.snapshot(), 0))
    seq = "model@train:30.container@model:40"
    assert plan.modules.names == ["", "model@train:30", seq, f"{seq}.linear@container:250",
                                  f"{seq}.activation@container:250", f"{seq}.linear@container:250#2"]
    assert [s.iteration for s in plan.steps] == [0, 1]
    assert plan.modules.parents[3:] == [2, 2, 2] and plan.modules.depths[3:] == [3, 3, 3]
