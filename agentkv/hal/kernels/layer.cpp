// One decoder block (llama family, gemma3) as one call from Python, and a model's whole stack
// of them as one call (DecoderStack).
//
// It runs the checked ops of bindings.cpp in the order of hal's Backend.decoder_block
// default, on the same tensors, so the output bits are that path's; what it saves are the
// ~10 Python and pybind crossings per block, about a fifth of a small model's decode step.
//
//   x --qkv--> attention_inputs (q/k norm, rope, K/V stored) --> paged_attention --o-->
//   h, x = add_norm(h, ., ffn_norm [, post_attn_norm])
//   x --gate|up--> glu --down--> h, x = add_norm(h, ., next_norm [, post_ffn_norm])
#include <vector>

#include "ops.h"

namespace agentkv {
namespace ops {
namespace {

// One projection: one weight, or the parts of an unfused one (outputs joined by columns,
// as the per-op path joins them), plus the bias of the joined output.
struct Projection {
    std::vector<at::Tensor> weights;
    std::vector<int64_t> qtypes, rows;
    c10::optional<at::Tensor> bias;
    int64_t k;
    bool int8;  // int8 activations (qmatmul.h)

    at::Tensor operator()(const at::Tensor& x) const {
        std::vector<at::Tensor> outs;
        for (size_t i = 0; i < weights.size(); ++i)
            outs.push_back(qtypes[i] == 0 ? ops::matmul_f32(x, weights[i]) : ops::qmatmul(x, weights[i], qtypes[i], rows[i], k, int8));
        at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 1);
        return bias.has_value() ? out + *bias : out;
    }
};

Projection projection(std::vector<at::Tensor> weights, std::vector<int64_t> qtypes, std::vector<int64_t> rows,
                      c10::optional<at::Tensor> bias, int64_t k, bool int8) {
    TORCH_CHECK(!weights.empty() && weights.size() == qtypes.size() && weights.size() == rows.size(),
                "a projection needs one qtype and one row count per weight, got ", weights.size(), " weights, ",
                qtypes.size(), " qtypes, ", rows.size(), " row counts");
    return Projection{std::move(weights), std::move(qtypes), std::move(rows), std::move(bias), k, int8};
}

// The block's scalars, set by name from Python (BlockConfig(heads=..., ...)).
struct BlockConfig {
    int64_t heads = 0, kv_heads = 0, head_dim = 0, rope_dim = 0, window = 0, act = 0;
    bool interleaved = false, unit_offset = false;
    double eps = 0.0, scale = 0.0;
};

// The block's norm gains: the FFN's input norm, the next block's (or the final) norm, and the
// optional post norms (gemma3) and per-head q/k norms (qwen3, gemma3).
struct BlockNorms {
    at::Tensor ffn_norm, next_norm;
    c10::optional<at::Tensor> post_attn_norm, post_ffn_norm, q_norm, k_norm;
};

// This layer's K/V store: slot-major rows (written) and the same memory as blocks (read).
struct BlockCache {
    at::Tensor k_cache, v_cache, k_blocks, v_blocks;
};

struct DecoderBlock {
    Projection qkv, o, gate_up, down;
    BlockNorms norms;
    BlockCache cache;
    BlockConfig c;

    // h [n, d] is updated in place (the residual); returns the next norm's output [n, d].
    at::Tensor run(at::Tensor h, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& positions, const at::Tensor& slots, const at::Tensor& block_tables,
                   const at::Tensor& row_seq, const at::Tensor& row_pos) const {
        const at::Tensor q = ops::attention_inputs(qkv(x), norms.q_norm, norms.k_norm, cos, sin, positions, slots,
                                                   cache.k_cache, cache.v_cache, c.heads, c.kv_heads, c.rope_dim,
                                                   c.interleaved, c.eps, c.unit_offset);
        const at::Tensor att = ops::paged_attention(q, cache.k_blocks, cache.v_blocks, block_tables, row_seq, row_pos,
                                                    c.scale, c.window, 0.0);
        const at::Tensor x2 = ops::add_norm(h, o(att.view({q.size(0), c.heads * c.head_dim})), norms.ffn_norm,
                                            norms.post_attn_norm, c.eps, c.unit_offset);
        return ops::add_norm(h, down(ops::glu(gate_up(x2), c.act)), norms.next_norm, norms.post_ffn_norm, c.eps,
                             c.unit_offset);
    }
};

// The whole stack of blocks as one call: block i's output is block i+1's normed input, so
// the blocks' bits are those of one run() per block; it saves a Python round trip (rope
// tables, step tensors, argument conversion) per block. rope[i] picks block i's cos/sin
// from the lists passed per step (gemma3's local and global layers have their own).
struct DecoderStack {
    std::vector<DecoderBlock> blocks;
    std::vector<int64_t> rope;

    at::Tensor run(at::Tensor h, at::Tensor x, const std::vector<at::Tensor>& cos, const std::vector<at::Tensor>& sin,
                   const at::Tensor& positions, const at::Tensor& slots, const at::Tensor& block_tables,
                   const at::Tensor& row_seq, const at::Tensor& row_pos) const {
        for (size_t i = 0; i < blocks.size(); ++i) {
            const int64_t r = rope[i];
            x = blocks[i].run(h, x, cos[r], sin[r], positions, slots, block_tables, row_seq, row_pos);
        }
        return x;
    }
};

DecoderStack decoder_stack(std::vector<DecoderBlock> blocks, std::vector<int64_t> rope, int64_t tables) {
    TORCH_CHECK(!blocks.empty() && blocks.size() == rope.size(), "a decoder stack needs one rope index per block, got ",
                blocks.size(), " blocks and ", rope.size(), " indices");
    for (size_t i = 0; i < rope.size(); ++i)
        TORCH_CHECK(rope[i] >= 0 && rope[i] < tables, "block ", i, "'s rope index ", rope[i], " is outside the ",
                    tables, " rope tables");
    return DecoderStack{std::move(blocks), std::move(rope)};
}

}  // namespace

void bind_layer(pybind11::module_& m) {
    namespace py = pybind11;
    py::class_<Projection>(m, "Projection");
    m.def("projection", &projection,
          "a projection: weight(s), qtype(s), row count(s), joined-output bias, k, int8 activations",
          py::arg("weights"), py::arg("qtypes"), py::arg("rows"), py::arg("bias"), py::arg("k"), py::arg("int8") = false);
    py::class_<BlockConfig>(m, "BlockConfig")
        .def(py::init([](int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rope_dim, bool interleaved,
                         int64_t window, int64_t act, double eps, bool unit_offset, double scale) {
                 return BlockConfig{heads, kv_heads, head_dim, rope_dim, window, act, interleaved, unit_offset,
                                    eps, scale};
             }),
             py::kw_only(), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("rope_dim"),
             py::arg("interleaved"), py::arg("window"), py::arg("act"), py::arg("eps"), py::arg("unit_offset"),
             py::arg("scale"));
    py::class_<BlockNorms>(m, "BlockNorms")
        .def(py::init([](at::Tensor ffn_norm, at::Tensor next_norm, c10::optional<at::Tensor> post_attn_norm,
                         c10::optional<at::Tensor> post_ffn_norm, c10::optional<at::Tensor> q_norm,
                         c10::optional<at::Tensor> k_norm) {
                 return BlockNorms{ffn_norm, next_norm, post_attn_norm, post_ffn_norm, q_norm, k_norm};
             }),
             py::kw_only(), py::arg("ffn_norm"), py::arg("next_norm"), py::arg("post_attn_norm") = py::none(),
             py::arg("post_ffn_norm") = py::none(), py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none());
    py::class_<BlockCache>(m, "BlockCache")
        .def(py::init([](at::Tensor k_cache, at::Tensor v_cache, at::Tensor k_blocks, at::Tensor v_blocks) {
                 return BlockCache{k_cache, v_cache, k_blocks, v_blocks};
             }),
             py::kw_only(), py::arg("k_cache"), py::arg("v_cache"), py::arg("k_blocks"), py::arg("v_blocks"));
    py::class_<DecoderBlock>(m, "DecoderBlock")
        .def(py::init([](Projection qkv, Projection o, Projection gate_up, Projection down, BlockNorms norms,
                         BlockCache cache, BlockConfig config) {
                 return DecoderBlock{std::move(qkv), std::move(o), std::move(gate_up), std::move(down),
                                     std::move(norms), std::move(cache), config};
             }),
             py::kw_only(), py::arg("qkv"), py::arg("o"), py::arg("gate_up"), py::arg("down"), py::arg("norms"),
             py::arg("cache"), py::arg("config"))
        .def("run", &DecoderBlock::run, py::call_guard<py::gil_scoped_release>(),
             "one block: h updated in place, returns the next norm's output",
             py::arg("h"), py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("positions"), py::arg("slots"),
             py::arg("block_tables"), py::arg("row_seq"), py::arg("row_pos"));
    py::class_<DecoderStack>(m, "DecoderStack")
        .def(py::init(&decoder_stack), py::kw_only(), py::arg("blocks"), py::arg("rope"), py::arg("tables"))
        .def("__len__", [](const DecoderStack& s) { return s.blocks.size(); })
        .def("run", &DecoderStack::run, py::call_guard<py::gil_scoped_release>(),
             "every block in order: h updated in place, returns the last block's next-norm output",
             py::arg("h"), py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("positions"), py::arg("slots"),
             py::arg("block_tables"), py::arg("row_seq"), py::arg("row_pos"));
}

}  // namespace ops
}  // namespace agentkv
