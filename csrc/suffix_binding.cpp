// specdec_ext._suffix: the Python binding of csrc/core/suffix_index.h and
// csrc/core/token_datastore.h (a small pybind11 module of its own, no torch headers: it
// compiles in seconds). Token lists in and out are Python lists of ints (a datastore's corpus
// also a buffer of int32 or uint16); bad arguments raise ValueError naming the argument.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/suffix_index.h"
#include "core/token_datastore.h"

namespace py = pybind11;
using specdec::suffix::Draft;
using specdec::suffix::ProposeParams;
using specdec::suffix::DatastoreParams;
using specdec::suffix::SuffixIndex;
using specdec::suffix::TokenDatastore;

namespace {

std::vector<int32_t> tokens_arg(const std::vector<int64_t>& in, const char* name) {
  std::vector<int32_t> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] < 0 || in[i] > std::numeric_limits<int32_t>::max()) {
      throw py::value_error(std::string(name) + "[" + std::to_string(i) + "] must be in [0, 2^31 - 1], got " +
                            std::to_string(in[i]));
    }
    out[i] = static_cast<int32_t>(in[i]);
  }
  return out;
}

// a corpus given as a 1-D contiguous buffer of int32 ('i') or uint16 ('H') tokens
std::vector<int32_t> corpus_arg(const py::buffer& buf) {
  const py::buffer_info info = buf.request();
  if (info.ndim != 1) throw py::value_error("tokens must be 1-D, got " + std::to_string(info.ndim) + " dimensions");
  if (info.shape[0] > 1 && info.strides[0] != info.itemsize) {
    throw py::value_error("tokens must be contiguous");
  }
  const bool i32 = info.itemsize == 4 && (info.format == "i" || info.format == "l" || info.format == "<i");
  const bool u16 = info.itemsize == 2 && (info.format == "H" || info.format == "<H");
  if (!i32 && !u16) {
    throw py::value_error("tokens must be a buffer of int32 ('i') or uint16 ('H'), got format '" + info.format +
                          "' of " + std::to_string(info.itemsize) + " bytes");
  }
  std::vector<int32_t> out(static_cast<size_t>(info.shape[0]));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = i32 ? static_cast<const int32_t*>(info.ptr)[i] : static_cast<const uint16_t*>(info.ptr)[i];
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_suffix, m) {
  m.doc() = "Depth-bounded suffix index with continuation counts (csrc/core/suffix_index.h) and a static "
            "token datastore over a suffix array (csrc/core/token_datastore.h)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  py::class_<SuffixIndex>(m, "SuffixIndex")
      .def(py::init<int64_t>(), py::arg("max_depth"))
      .def_property_readonly("max_depth", &SuffixIndex::max_depth)
      .def_property_readonly("num_sequences", &SuffixIndex::num_sequences)
      .def_property_readonly("num_nodes", &SuffixIndex::num_nodes)
      .def("has_sequence", &SuffixIndex::has_sequence, py::arg("id"))
      .def("add_sequence", &SuffixIndex::add_sequence, py::arg("id"))
      .def("append", [](SuffixIndex& s, int64_t id, const std::vector<int64_t>& tokens) {
            auto t = tokens_arg(tokens, "tokens");
            s.append(id, t.data(), static_cast<int64_t>(t.size()));
          }, py::arg("id"), py::arg("tokens"))
      .def("remove", &SuffixIndex::remove, py::arg("id"))
      .def("counts", [](const SuffixIndex& s, const std::vector<int64_t>& pattern) {
            auto t = tokens_arg(pattern, "pattern");
            return s.counts(t.data(), static_cast<int64_t>(t.size()));
          }, py::arg("pattern"), "(count, cont) of a pattern: its occurrences, and those followed by a token")
      .def("propose", [](const SuffixIndex& s, const std::vector<int64_t>& context, int64_t max_spec_tokens,
                         double factor, double offset, double min_prob, bool tree) {
            auto t = tokens_arg(context, "context");
            ProposeParams p;
            p.max_spec_tokens = max_spec_tokens;
            p.factor = factor;
            p.offset = offset;
            p.min_prob = min_prob;
            p.tree = tree;
            Draft d = s.propose(t.data(), static_cast<int64_t>(t.size()), p);
            return py::make_tuple(d.tokens, d.parents, d.probs, d.score, d.match_length);
          }, py::arg("context"), py::arg("max_spec_tokens"), py::arg("factor") = 1.0, py::arg("offset") = 0.0,
          py::arg("min_prob") = 0.1, py::arg("tree") = false,
          "(tokens, parents, probs, score, match_length) of the best draft after context");
  py::class_<TokenDatastore>(m, "TokenDatastore")
      .def(py::init([](const py::buffer& tokens, int64_t sort_depth) {
             return new TokenDatastore(corpus_arg(tokens), sort_depth);
           }), py::arg("tokens"), py::arg("sort_depth"),
           "tokens: 1-D buffer of int32 or uint16 ids; builds the suffix array sorted sort_depth tokens deep")
      .def_property_readonly("size", &TokenDatastore::size)
      .def_property_readonly("sort_depth", &TokenDatastore::sort_depth)
      .def("suffix_array", [](const TokenDatastore& s) { return s.suffix_array(); })
      .def("count", [](const TokenDatastore& s, const std::vector<int64_t>& pattern) {
            auto t = tokens_arg(pattern, "pattern");
            return s.count(t.data(), static_cast<int64_t>(t.size()));
          }, py::arg("pattern"), "occurrences of pattern (at most sort_depth tokens) in the corpus")
      .def("propose", [](const TokenDatastore& s, const std::vector<int64_t>& context, int64_t max_tokens,
                         int64_t max_depth, double min_prob, int64_t max_scan, double prior) {
            auto t = tokens_arg(context, "context");
            DatastoreParams p;
            p.max_tokens = max_tokens;
            p.max_depth = max_depth;
            p.min_prob = min_prob;
            p.max_scan = max_scan;
            p.prior = prior;
            Draft d = s.propose(t.data(), static_cast<int64_t>(t.size()), p);
            return py::make_tuple(d.tokens, d.probs, d.score, d.match_length);
          }, py::arg("context"), py::arg("max_tokens"), py::arg("max_depth") = 24, py::arg("min_prob") = 0.1,
          py::arg("max_scan") = 4096, py::arg("prior") = 2.0, "(tokens, probs, score, match_length) of the chain draft after context");
}
