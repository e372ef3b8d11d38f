// The TorchScript reference backend: a compiler in preprocess and an interpreter in execute.
//
// preprocess inlines each method's graph and compiles it to a compact instruction list: every
// operator node becomes one instruction (the operator's name and overload, the slots it reads
// and writes, and the debug handle torch gave the node); parameters and constants become slot
// values. It rejects any node it cannot run with the seed compiler's text, "The node of <kind> is
// not supported in this compiler. Source code: <the node's source with carets>".
//
// execute runs the instructions in order, each operator through the c10 dispatcher, and rethrows
// any failure with the failing node's debug handle (TORCH_DELEGATED_BACKEND_THROW), so that the
// lite interpreter shows it as the model's own source line.
//
// Built as the reference library, it registers one backend, "torchscript_reference". Built with
// BACKENDCONF_TS_BROKEN defined (the project's tests do), it registers instead the deliberately
// broken variants below, each a few lines different from the reference, under "ts_broken_<what>".
// Both libraries are built by backendconf_torchscript_reference/_build.py.

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/backends/backend.h>
#include <torch/csrc/jit/backends/backend_debug_handler.h>
#include <torch/csrc/jit/backends/backend_exception.h>
#include <torch/csrc/jit/backends/backend_preprocess.h>
#include <torch/csrc/jit/mobile/type_parser.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#ifdef BACKENDCONF_TS_BROKEN
namespace backendconf_ts_broken {
#else
namespace backendconf_ts {
#endif

// The variants: the reference, and the broken ones (each changes a few lines below).
enum Variant : int {
  REFERENCE = 0,
  BROKEN_NO_HANDLE,         // rethrows a failure without the node's debug handle
  BROKEN_UNAVAILABLE,       // is_available() false everywhere
  BROKEN_REJECT_TEXT,       // rejects a node without its source
  BROKEN_WRONG_RESULT,      // aten::mul computes an add
  BROKEN_CRASH,             // aborts the process in execute
  BROKEN_HANG,              // sleeps forever in execute
  BROKEN_MUTATES,           // writes into its first input
  BROKEN_NONDETERMINISTIC,  // preprocess output depends on the clock
  BROKEN_LEAK,              // keeps a copy of every input alive
  BROKEN_ACCEPTS_ALL,       // accepts operators it cannot run, fails at execute
  BROKEN_CONSUMES_BLOB,     // compile empties the processed module's constants: a saved model has none
  BROKEN_HOST_STATE,        // keeps parameters in a table of the host process, not in the blob
  BROKEN_PREPROCESS_NEEDS_DEVICE,  // unavailable, and preprocess fails without the device
};


using torch::jit::Node;
using torch::jit::Value;
using c10::IValue;

// BROKEN_HOST_STATE's table: filled by preprocess, read by execute; empty in any other process.
std::vector<IValue>& host_table() {
  static std::vector<IValue> values;
  return values;
}

namespace {

constexpr int64_t kNoHandle = -1;

// Instruction kinds, stored as ints in the program.
enum Kind : int64_t { kOp = 0, kList = 1, kTuple = 2, kTupleUnpack = 3, kListUnpack = 4, kJit = 5, kGuard = 6 };

template <int V>
struct Compiler {
  const torch::jit::Module& module;
  const torch::jit::NodeToDebugHandle& handles;
  std::unordered_map<const Value*, int64_t> slot;
  std::unordered_map<const Value*, IValue> known;  // values fixed at compile time (modules, attributes)
  c10::impl::GenericList constants{c10::AnyType::get()};
  c10::impl::GenericList instructions{c10::AnyType::get()};
  int64_t next_slot = 0;

  int64_t new_slot(const Value* v) {
    slot[v] = next_slot;
    return next_slot++;
  }

  [[noreturn]] void reject(const Node* node) {
    if constexpr (V == BROKEN_REJECT_TEXT) {
      TORCH_CHECK(false, "The node of ", node->kind().toQualString(), " is not supported in this compiler.");
    }
    TORCH_CHECK(
        false,
        "The node of ",
        node->kind().toQualString(),
        " is not supported in this compiler. Source code: ",
        node->sourceRange().str());
  }

  // The slot of a value an instruction reads: a constant or compile-time value gets one the first time.
  int64_t use(const Node* node, const Value* v) {
    auto it = slot.find(v);
    if (it != slot.end()) {
      return it->second;
    }
    auto k = known.find(v);
    if (k == known.end() || k->second.isObject()) {
      reject(node);  // a module object used as a value: nothing this interpreter can run
    }
    int64_t s = new_slot(v);
    if (k->second.isTensor()) {
      k->second = k->second.toTensor().detach();  // a parameter's value, without its autograd history
    }
    if (V == BROKEN_HOST_STATE && k->second.isTensor()) {
      host_table().push_back(k->second);
      constants.push_back(c10::ivalue::Tuple::create(
          {IValue(s), IValue(std::string("host:") + std::to_string(host_table().size() - 1))}));
      return s;
    }
    constants.push_back(c10::ivalue::Tuple::create({IValue(s), k->second}));
    return s;
  }

  int64_t handle_of(const Node* node) {
    auto it = handles.find(const_cast<Node*>(node));
    return it == handles.end() ? kNoHandle : it->second;
  }

  void emit(const Node* node, int64_t kind, const std::string& name, const std::string& overload,
            const std::string& extra) {
    c10::List<int64_t> ins;
    for (const Value* v : node->inputs()) {
      ins.push_back(use(node, v));
    }
    c10::List<int64_t> outs;
    for (const Value* v : node->outputs()) {
      outs.push_back(new_slot(v));
    }
    instructions.push_back(c10::ivalue::Tuple::create(
        {IValue(kind), IValue(name), IValue(overload), IValue(ins), IValue(outs), IValue(handle_of(node)),
         IValue(extra)}));
  }

  void compile_block(const torch::jit::Block* block) {
    for (const Node* node : block->nodes()) {
      const auto kind = node->kind();
      if (fold(node)) {
        continue;
      }
      if (kind == c10::prim::Constant) {
        // A constant with no value (a function, say) stays unknown: any node using it is rejected.
        if (auto value = torch::jit::toIValue(node->output())) {
          known[node->output()] = *value;
        }
      } else if (kind == c10::prim::GetAttr) {
        auto owner = known.find(node->input());
        if (owner == known.end() || !owner->second.isObject()) {
          reject(node);
        }
        known[node->output()] = owner->second.toObjectRef().getAttr(node->s(c10::attr::name));
      } else if (kind == c10::prim::If && known.count(node->input()) && known[node->input()].isBool()) {
        // A condition known when compiling (self.training, an optional argument's presence): only the
        // branch it takes is compiled, and the If's outputs are that branch's.
        const auto* taken = node->blocks()[known[node->input()].toBool() ? 0 : 1];
        compile_block(taken);
        for (size_t i = 0; i < node->outputs().size(); ++i) {
          alias(node, node->outputs()[i], taken->outputs()[i]);
        }
      } else if (kind == c10::prim::If && node->outputs().empty() && raise_branch(node) >= 0) {
        // `if <runtime condition>: raise ...` (a model checking its input): a guard that throws, with
        // this node's debug handle, when the condition takes the raising branch.
        emit_guard(node, raise_branch(node) == 0);
      } else if (kind == c10::prim::Uninitialized) {
        known[node->output()] = IValue();  // only on a path that raises
      } else if (kind == c10::prim::ListConstruct) {
        auto element = node->output()->type()->expectRef<c10::ListType>().getElementType();
        emit(node, kList, "", "", element->annotation_str());
      } else if (kind == c10::prim::TupleConstruct) {
        emit(node, kTuple, "", "", "");
      } else if (kind == c10::prim::TupleUnpack) {
        emit(node, kTupleUnpack, "", "", "");
      } else if (kind == c10::prim::ListUnpack) {
        emit(node, kListUnpack, "", "", "");
      } else if (kind.is_aten() && node->maybeSchema() != nullptr &&
                 c10::Dispatcher::singleton()
                     .findSchema({node->schema().name(), node->schema().overload_name()})
                     .has_value()) {
        emit(node, kOp, node->schema().name(), node->schema().overload_name(), "");
      } else if ((kind.is_aten() || kind.is_prim()) && node->maybeSchema() != nullptr &&
                 torch::jit::findOperatorFor(node->schema().operator_name()) != nullptr) {
        // TorchScript's own builtins (aten::size, prim::dtype, ...) live in the JIT's operator table.
        emit(node, kJit, node->schema().name(), node->schema().overload_name(), "");
      } else if (V == BROKEN_ACCEPTS_ALL && node->maybeSchema() != nullptr) {
        emit(node, kOp, node->schema().name(), node->schema().overload_name(), "");
      } else {
        reject(node);
      }
    }
  }

  // An operator on values all known when compiling, giving no tensor (x.dim(), `bias is None`, ...):
  // computed now, its results known, no instruction.
  bool fold(const Node* node) {
    if (node->kind() == c10::prim::Constant || node->kind() == c10::prim::GetAttr || node->blocks().size() ||
        node->outputs().empty() || node->maybeSchema() == nullptr || node->hasSideEffects()) {
      return false;
    }
    for (const Value* v : node->inputs()) {
      auto k = known.find(v);
      if (k == known.end() || k->second.isObject()) {
        return false;
      }
    }
    for (const Value* v : node->outputs()) {
      if (v->type()->kind() == c10::TypeKind::TensorType || v->type()->containedTypes().size()) {
        return false;
      }
    }
    auto op = torch::jit::findOperatorFor(node->schema().operator_name());
    if (op == nullptr) {
      return false;
    }
    torch::jit::Stack stack;
    for (const Value* v : node->inputs()) {
      stack.push_back(known[v]);
    }
    try {
      op->getOperation(node)(stack);
    } catch (const c10::Error&) {
      return false;  // left to run (and fail with its debug handle) at execute
    }
    for (size_t i = 0; i < node->outputs().size(); ++i) {
      known[node->outputs()[i]] = stack[i];
    }
    return true;
  }

  // Which branch of an If only raises (the other doing nothing): 0 or 1; -1 if neither.
  static int raise_branch(const Node* node) {
    for (int b = 0; b < 2; ++b) {
      const auto* raising = node->blocks()[b];
      const auto* other = node->blocks()[1 - b];
      bool raises = false;
      for (const Node* n : raising->nodes()) {
        raises = raises || n->kind() == c10::prim::RaiseException;
      }
      if (raises && other->nodes().begin() == other->nodes().end()) {
        return b;
      }
    }
    return -1;
  }

  void emit_guard(const Node* node, bool raise_when_true) {
    c10::List<int64_t> ins;
    ins.push_back(use(node, node->input()));
    instructions.push_back(c10::ivalue::Tuple::create(
        {IValue(static_cast<int64_t>(kGuard)), IValue(std::string("prim::If")), IValue(std::string("")), IValue(ins),
         IValue(c10::List<int64_t>()), IValue(handle_of(node)), IValue(std::string(raise_when_true ? "1" : "0"))}));
  }

  // ``to`` holds what ``from`` holds: the same slot, or the same known value.
  void alias(const Node* node, const Value* to, const Value* from) {
    auto s = slot.find(from);
    if (s != slot.end()) {
      slot[to] = s->second;
    } else if (known.count(from)) {
      known[to] = known[from];
    } else {
      reject(node);
    }
  }

  IValue compile(const std::shared_ptr<torch::jit::Graph>& graph) {
    auto inputs = graph->inputs();
    known[inputs[0]] = module._ivalue();  // self
    for (size_t i = 1; i < inputs.size(); ++i) {
      new_slot(inputs[i]);
    }
    compile_block(graph->block());
    c10::List<int64_t> outputs;
    for (const Value* v : graph->outputs()) {
      outputs.push_back(use(graph->return_node(), v));
    }
    auto returns = graph->outputs()[0]->type()->kind() == c10::TypeKind::TupleType;
    return c10::ivalue::Tuple::create(
        {IValue(static_cast<int64_t>(inputs.size() - 1)), IValue(next_slot), constants, instructions,
         IValue(outputs), IValue(returns)});
  }
};

template <int V>
IValue preprocess(const torch::jit::Module& mod, const c10::Dict<IValue, IValue>& method_compile_spec,
                  const torch::jit::BackendDebugHandleGenerator& generate_debug_handles) {
  c10::Dict<IValue, IValue> compiled(c10::StringType::get(), c10::AnyType::get());
  if constexpr (V == BROKEN_PREPROCESS_NEEDS_DEVICE) {
    TORCH_CHECK(false, "preprocess needs the device, which is not present");
  }
  for (const auto& entry : method_compile_spec) {
    const std::string& method_name = entry.key().toStringRef();
    auto graph = torch::jit::toGraphFunction(mod.get_method(method_name).function()).graph()->copy();
    torch::jit::Inline(*graph);
    auto handles = generate_debug_handles(graph);
    Compiler<V> compiler{mod, handles};
    compiled.insert(method_name, compiler.compile(graph));
  }
  if constexpr (V == BROKEN_NONDETERMINISTIC) {
    compiled.insert("__built_at__", IValue(std::chrono::steady_clock::now().time_since_epoch().count()));
  }
  return compiled;
}

std::vector<IValue>& kept() {
  static std::vector<IValue> values;
  return values;
}

}  // namespace

template <int V>
class ReferenceBackend : public torch::jit::PyTorchBackendInterface {
 public:
  ReferenceBackend() = default;
  ~ReferenceBackend() override = default;

  bool is_available() override {
    return V != BROKEN_UNAVAILABLE && V != BROKEN_PREPROCESS_NEEDS_DEVICE;
  }

  // The processed program is already what execute runs: compile checks it and hands it back.
  c10::impl::GenericDict compile(IValue processed, c10::impl::GenericDict method_compile_spec) override {
    auto programs = processed.toGenericDict();
    c10::Dict<IValue, IValue> handles(c10::StringType::get(), c10::AnyType::get());
    for (const auto& entry : method_compile_spec) {
      const auto& method = entry.key();
      TORCH_CHECK(programs.contains(method), "no compiled program for method ", method.toStringRef());
      handles.insert(method, programs.at(method));
      if constexpr (V == BROKEN_CONSUMES_BLOB) {
        // Takes the constants for itself: the handle keeps a copy, the processed module (saved) is emptied.
        auto elements = programs.at(method).toTupleRef().elements().vec();
        auto kept = elements[2].toList().copy();
        elements[2].toList().clear();
        elements[2] = IValue(kept);
        handles.insert_or_assign(method, c10::ivalue::Tuple::create(std::move(elements)));
      }
    }
    return c10::impl::toGenericDict(handles);
  }

  c10::impl::GenericList execute(IValue handle, c10::impl::GenericList inputs) override {
    const auto& program = handle.toTupleRef().elements();
    const int64_t n_inputs = program[0].toInt();
    TORCH_CHECK(static_cast<int64_t>(inputs.size()) == n_inputs, "expected ", n_inputs, " inputs, got ",
                inputs.size());
    std::vector<IValue> slots(program[1].toInt());
    for (int64_t i = 0; i < n_inputs; ++i) {
      slots[i] = inputs.get(i);
    }
    if constexpr (V == BROKEN_CRASH) {
      std::abort();
    }
    if constexpr (V == BROKEN_HANG) {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
    if constexpr (V == BROKEN_MUTATES) {
      if (n_inputs > 0 && slots[0].isTensor()) {
        slots[0].toTensor().add_(1);
      }
    }
    if constexpr (V == BROKEN_LEAK) {
      for (int64_t i = 0; i < n_inputs; ++i) {
        if (slots[i].isTensor()) {
          kept().push_back(slots[i].toTensor().clone());
        }
      }
    }
    for (const auto& entry : program[2].toListRef()) {
      const auto& constant = entry.toTupleRef().elements();
      slots[constant[0].toInt()] = constant[1];
      if (V == BROKEN_HOST_STATE && constant[1].isString() && constant[1].toStringRef().rfind("host:", 0) == 0) {
        size_t index = std::stoul(constant[1].toStringRef().substr(5));
        TORCH_CHECK(index < host_table().size(), "parameter ", index, " is not in this process's table");
        slots[constant[0].toInt()] = host_table()[index];
      }
    }
    for (const auto& entry : program[3].toListRef()) {
      run(entry.toTupleRef().elements(), slots);
    }
    c10::impl::GenericList outputs(c10::AnyType::get());
    for (int64_t s : program[4].toIntList()) {
      if (program[5].toBool() && slots[s].isTuple()) {
        for (const auto& element : slots[s].toTupleRef().elements()) {
          outputs.push_back(element);
        }
      } else {
        outputs.push_back(slots[s]);
      }
    }
    return outputs;
  }

 private:
  static void run(const std::vector<IValue>& instruction, std::vector<IValue>& slots) {
    const int64_t kind = instruction[0].toInt();
    const auto ins = instruction[3].toIntList();
    const auto outs = instruction[4].toIntList();
    const int64_t debug_handle = instruction[5].toInt();
    try {
      switch (kind) {
        case kOp: {
          auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
              instruction[1].toStringRef().c_str(), instruction[2].toStringRef().c_str());
          torch::jit::Stack stack;
          stack.reserve(ins.size());
          for (int64_t s : ins) {
            stack.push_back(slots[s]);
          }
          if constexpr (V == BROKEN_WRONG_RESULT) {
            if (instruction[1].toStringRef() == "aten::mul" && instruction[2].toStringRef() == "Tensor") {
              op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
              stack.push_back(IValue(1));
            }
          }
          op.callBoxed(stack);
          TORCH_CHECK(stack.size() == outs.size(), instruction[1].toStringRef(), " returned ", stack.size(),
                      " values, expected ", outs.size());
          for (size_t i = 0; i < outs.size(); ++i) {
            slots[outs[i]] = std::move(stack[i]);
          }
          break;
        }
        case kJit: {
          auto op = torch::jit::findOperatorFor(
              c10::OperatorName(instruction[1].toStringRef(), instruction[2].toStringRef()));
          TORCH_CHECK(op != nullptr, "no operator ", instruction[1].toStringRef(), ".", instruction[2].toStringRef());
          torch::jit::Stack stack;
          for (int64_t s : ins) {
            stack.push_back(slots[s]);
          }
          op->getOperation()(stack);
          TORCH_CHECK(stack.size() == outs.size(), instruction[1].toStringRef(), " returned ", stack.size(),
                      " values, expected ", outs.size());
          for (size_t i = 0; i < outs.size(); ++i) {
            slots[outs[i]] = std::move(stack[i]);
          }
          break;
        }
        case kGuard: {
          const bool raise_when_true = instruction[6].toStringRef() == "1";
          TORCH_CHECK(slots[ins[0]].toBool() != raise_when_true,
                      "the model's own check of its inputs failed (the branch that raises)");
          break;
        }
        case kList: {
          c10::impl::GenericList list(c10::parseType(instruction[6].toStringRef()));
          for (int64_t s : ins) {
            list.push_back(slots[s]);
          }
          slots[outs[0]] = IValue(list);
          break;
        }
        case kTuple: {
          std::vector<IValue> elements;
          for (int64_t s : ins) {
            elements.push_back(slots[s]);
          }
          slots[outs[0]] = c10::ivalue::Tuple::create(std::move(elements));
          break;
        }
        case kTupleUnpack: {
          const auto& elements = slots[ins[0]].toTupleRef().elements();
          TORCH_CHECK(elements.size() == outs.size(), "tuple of ", elements.size(), " unpacked into ", outs.size());
          for (size_t i = 0; i < outs.size(); ++i) {
            slots[outs[i]] = elements[i];
          }
          break;
        }
        case kListUnpack: {
          auto list = slots[ins[0]].toList();
          TORCH_CHECK(list.size() == outs.size(), "list of ", list.size(), " unpacked into ", outs.size());
          for (size_t i = 0; i < outs.size(); ++i) {
            slots[outs[i]] = list.get(i);
          }
          break;
        }
        default:
          TORCH_CHECK(false, "unknown instruction kind ", kind);
      }
    } catch (const c10::BackendRuntimeException&) {
      throw;
    } catch (const c10::Error& e) {
      if constexpr (V == BROKEN_NO_HANDLE) {
        TORCH_CHECK(false, e.what_without_backtrace());
      }
      TORCH_DELEGATED_BACKEND_THROW(false, e.what_without_backtrace(), debug_handle);
    }
  }
};

namespace {
// Registers a backend class and its preprocess function with torch (when the library is loaded).
template <int V>
bool register_backend(const char* name) {
  static const auto backend_class = torch::jit::backend<ReferenceBackend<V>>(name);
  static const auto preprocess_registration = torch::jit::backend_preprocess_register(name, preprocess<V>);
  return true;
}

#ifndef BACKENDCONF_TS_BROKEN
const bool registered = register_backend<REFERENCE>("torchscript_reference");
#else
const bool registered = register_backend<BROKEN_NO_HANDLE>("ts_broken_no_handle") &&
                        register_backend<BROKEN_UNAVAILABLE>("ts_broken_unavailable") &&
                        register_backend<BROKEN_REJECT_TEXT>("ts_broken_reject_text") &&
                        register_backend<BROKEN_WRONG_RESULT>("ts_broken_wrong_result") &&
                        register_backend<BROKEN_CRASH>("ts_broken_crash") &&
                        register_backend<BROKEN_HANG>("ts_broken_hang") &&
                        register_backend<BROKEN_MUTATES>("ts_broken_mutates") &&
                        register_backend<BROKEN_NONDETERMINISTIC>("ts_broken_nondeterministic") &&
                        register_backend<BROKEN_LEAK>("ts_broken_leak") &&
                        register_backend<BROKEN_ACCEPTS_ALL>("ts_broken_accepts_all") &&
                        register_backend<BROKEN_CONSUMES_BLOB>("ts_broken_consumes_blob") &&
                        register_backend<BROKEN_HOST_STATE>("ts_broken_host_state") &&
                        register_backend<BROKEN_PREPROCESS_NEEDS_DEVICE>("ts_broken_preprocess_needs_device");
#endif
}  // namespace

}  // namespace backendconf_ts
