// Packed variable-length batches (docs/spec.md section 1c): the kernel suite's `lengths` and
// `varlen` keys, written as text, and the document lengths they stand for.
//
//   lengths: 7000 1000 192          the documents, in order (spaces or '+' between them)
//   varlen:  32768 64 8192 uniform  a seeded draw: TOKENS MIN MAX [uniform|log] [SEED]
//
// A varlen draw takes lengths in [MIN, MAX] (uniform in the length, or uniform in its log: more
// short documents, as real corpora have) until they reach TOKENS; the last one is cut to make the
// total exact, and a cut below MIN joins the document before it when that stays within MAX.
#pragma once

#include <string>
#include <vector>

namespace lattn {

// The canonical text of a `lengths` value ("7000+1000+192"); throws std::invalid_argument with a
// one-line reason for anything else (a length below 1, no lengths, over kMaxDocuments).
std::string canonical_lengths(const std::string& text);
// The canonical text of a `varlen` value ("32768:64:8192:uniform:0"); throws std::invalid_argument.
std::string canonical_varlen(const std::string& text);

// The documents of a canonical `lengths` or `varlen` text (empty text: none).
std::vector<int> lengths_of(const std::string& canonical_lengths);
std::vector<int> draw_varlen(const std::string& canonical_varlen);

constexpr long kMaxDocuments = 1 << 16;

}  // namespace lattn
