// A tiny document model: the report is built once as a list of blocks (headings, paragraphs,
// bullet lists, tables, images) and printed twice, as GitHub Markdown and as one self-contained
// HTML file (inline CSS, PNGs embedded as base64 data URIs, no external resources).
#pragma once
#include <string>
#include <vector>

#include "reports/tables.h"

namespace rh::report {

struct Block {
  enum class Kind { heading, paragraph, bullets, table, image } kind = Kind::paragraph;
  int level = 2;                    // heading level
  std::string text;                 // heading / paragraph text, image caption
  std::vector<std::string> items;   // bullets
  Table table;
  std::string image;                // image path relative to the run dir ("plots/x.png")
};

struct Document {
  std::string title;
  std::vector<Block> blocks;
  void heading(const std::string& text, int level = 2);
  void paragraph(const std::string& text);
  void bullets(std::vector<std::string> items);   // by value: a 100,000-row table is moved, not copied
  void table(Table t);
  void image(const std::string& rel_path, const std::string& caption);
};

std::string base64(const std::string& bytes);

// Markdown: images are relative links (report.md sits in the run dir next to plots/).
std::string render_markdown(const Document& d);
// HTML: images are read from run_dir and embedded; an unreadable image is a ReportError.
std::string render_html(const Document& d, const std::string& run_dir);

}  // namespace rh::report
