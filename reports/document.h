// A tiny document model: the report is built once as a list of blocks (headings, paragraphs,
// bullet lists, tables, images) and printed twice, as GitHub Markdown and as one self-contained
// HTML file (inline CSS, PNGs embedded as base64 data URIs, no external resources).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "reports/tables.h"

namespace rh::report {

// GitHub's limit is 65,536 characters; the rest is room for a CI step's own lines.
constexpr size_t kMarkdownLimit = 60000;

struct Block {
  enum class Kind { heading, paragraph, bullets, table, image } kind = Kind::paragraph;
  int level = 2;                    // heading level
  std::string text;                 // heading / paragraph text, image caption
  std::vector<std::string> items;   // bullets
  Table table;
  std::string image;   // image path relative to the run dir ("plots/x.png")
  // Which output prints the block (the matrix is one table in report.md, one folded table per
  // group in report.html).
  enum class Only { both, markdown, html } only = Only::both;
};

struct Document {
  std::string title;
  // The verdict, printed before everything else: a banner at the top of report.html (class
  // "status pass" or "status fail") and the first line under report.md's title.
  std::string status;
  bool status_ok = true;
  // Level-2 sections from this block on are folded in report.md (<details><summary>heading), so a
  // pull-request comment or CI step summary shows the verdict, the failures and the key findings
  // first. report.html shows them open.
  size_t fold_from = static_cast<size_t>(-1);
  // report.md stays under this many bytes (so under as many characters): GitHub refuses a comment
  // or a step summary over 65,536 characters, and a CI step may add its own lines around it. The
  // blocks before fold_from come first (their bullet lists cut with a count of what was cut when
  // they alone would pass two thirds of it); a folded section that does not fit is given without
  // its tables, or left out, and a paragraph under the unfolded part names what was left out.
  // report.html always holds everything.
  size_t markdown_limit = kMarkdownLimit;
  std::vector<Block> blocks;
  void heading(const std::string& text, int level = 2);
  void paragraph(const std::string& text);
  void bullets(std::vector<std::string> items);   // by value: a 100,000-row table is moved, not copied
  void table(Table t, Block::Only only = Block::Only::both);
  void image(const std::string& rel_path, const std::string& caption);
};

std::string base64(const std::string& bytes);

// Markdown for GitHub (a pull-request comment, a CI step summary, a file in the run directory).
// An image is a sentence naming its PNG and report.html, never a link: a relative link breaks once
// the text is posted. With image_links, images are relative links ("plots/x.png") for reading
// report.md in place, next to plots/.
std::string render_markdown(const Document& d, bool image_links = false);
// HTML: images are read from run_dir and embedded; an unreadable image is a ReportError.
std::string render_html(const Document& d, const std::string& run_dir);

}   // namespace rh::report
