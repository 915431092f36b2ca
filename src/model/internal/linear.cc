#include "model/internal/linear.h"

#include <string_view>

namespace dsi::internal {

Status parse_weight_formats(const std::string& spec, ClassFormats& out) {
    static const char* const kClassNames[] = {"attn",    "mlp",    "shared",
                                              "experts", "router", "head"};
    auto parse_one = [](std::string_view v, std::optional<kernels::WeightFormat>& f) {
        if (v == "auto") {
            f.reset();
            return true;
        }
        kernels::WeightFormat wf;
        if (!kernels::parse_weight_format(v, &wf)) return false;
        f = wf;
        return true;
    };
    for (auto& f : out) f.reset();
    if (spec.empty()) return Status::ok();
    std::string_view rest = spec;
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos) {
            std::optional<kernels::WeightFormat> f;
            if (!parse_one(item, f)) {
                return invalid_argument("weight format: unknown format '" + std::string(item) + "'");
            }
            for (auto& o : out) o = f;
            continue;
        }
        const std::string_view cls = item.substr(0, eq);
        int index = -1;
        for (int i = 0; i < static_cast<int>(WeightClass::kCount); ++i) {
            if (cls == kClassNames[i]) index = i;
        }
        if (index < 0 || !parse_one(item.substr(eq + 1), out[static_cast<size_t>(index)])) {
            return invalid_argument("weight format: bad entry '" + std::string(item) +
                                    "' (classes: attn, mlp, shared, experts, router, head)");
        }
    }
    return Status::ok();
}

Status pack_linear(const ClassFormats& formats, WeightClass cls, Linear& lin) {
    const WeightMatrix& w = lin.w;
    kernels::SourceMatrix src{w.dtype, w.rows, w.cols, w.data, w.block_scale, w.block_rows,
                              w.block_cols};
    const kernels::WeightFormat native = kernels::native_weight_format(w.dtype);
    kernels::WeightFormat format = formats[static_cast<size_t>(cls)].value_or(native);
    Result<kernels::PackedMatrix> packed = kernels::pack_matrix(src, format);
    if (!packed.is_ok() && format != native) {
        // The requested format does not fit this tensor: keep the stored one.
        packed = kernels::pack_matrix(src, native);
    }
    if (!packed.is_ok()) return packed.status();
    lin.packed = std::move(packed).value();
    lin.is_packed = true;
    return Status::ok();
}

}  // namespace dsi::internal
