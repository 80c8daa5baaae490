// Markdown and HTML printers of a Document; see document.h.
#include "reports/document.h"

#include "reports/run_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace rh::report {
namespace {

const char* kCss =
    R"(body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;max-width:1400px;
padding:0 1em;color:#1f2328;line-height:1.45}
h1{border-bottom:2px solid #d0d7de;padding-bottom:.3em}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:2em}
.status{font-size:16px;padding:.6em 1em;border-radius:6px;margin:0 0 1em}
.status.pass{background:#dafbe1;border:1px solid #1a7f37}.status.fail{background:#ffebe9;border:1px solid #cf222e}
table{border-collapse:collapse;font-size:13px;margin:1em 0;max-width:100%}
th,td{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top;overflow-wrap:anywhere}
th{background:#f6f8fa;text-align:left;overflow-wrap:break-word}
table.matrix{font-size:11px}table.matrix th,table.matrix td{padding:3px 5px}
table.matrix td:nth-child(2),table.matrix td:nth-child(3){white-space:nowrap}
table.matrix td:first-child{min-width:270px;overflow-wrap:normal}
table.matrix td .sub{font-size:10.5px;color:#57606a;overflow-wrap:anywhere}
details.fold{margin:.3em 0}details.fold>summary{cursor:pointer;font-size:14px;padding:2px 0}
details.fold>table{margin-top:.3em}
td[title]{cursor:help}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.pass td:first-child{border-left:5px solid #1a7f37}
tr.fail td:first-child{border-left:5px solid #cf222e}
tr.fail{background:#fff5f5}
td.o-identical{background:#dafbe1}td.o-within-tolerance{background:#eef9d0}
td.o-diverged-as-expected{background:#ddf4ff}td.o-failed{background:#ffd8d3;font-weight:600}
td.o-none{color:#8c959f}
img{max-width:100%;border:1px solid #d0d7de;margin:.5em 0}
figcaption{font-size:13px;color:#57606a}
)";

}   // namespace

void Document::heading(const std::string& text, int level) {
  Block b;
  b.kind = Block::Kind::heading;
  b.level = level;
  b.text = text;
  blocks.push_back(std::move(b));
}
void Document::paragraph(const std::string& text) {
  Block b;
  b.kind = Block::Kind::paragraph;
  b.text = text;
  blocks.push_back(std::move(b));
}
void Document::bullets(std::vector<std::string> items) {
  Block b;
  b.kind = Block::Kind::bullets;
  b.items = std::move(items);
  blocks.push_back(std::move(b));
}
void Document::table(Table t, Block::Only only) {
  Block b;
  b.kind = Block::Kind::table;
  b.table = std::move(t);
  b.only = only;
  blocks.push_back(std::move(b));
}
void Document::image(const std::string& rel_path, const std::string& caption) {
  Block b;
  b.kind = Block::Kind::image;
  b.image = rel_path;
  b.text = caption;
  blocks.push_back(std::move(b));
}

std::string base64(const std::string& in) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    out += tbl[(v >> 18) & 63];
    out += tbl[(v >> 12) & 63];
    out += tbl[(v >> 6) & 63];
    out += tbl[v & 63];
  }
  if (i < in.size()) {
    const bool two = i + 1 < in.size();
    const unsigned v =
        (static_cast<unsigned char>(in[i]) << 16) | (two ? static_cast<unsigned char>(in[i + 1]) << 8 : 0);
    out += tbl[(v >> 18) & 63];
    out += tbl[(v >> 12) & 63];
    out += two ? tbl[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

namespace {

constexpr size_t kMaxHeadItemBytes = 2000;   // one failure's line in the unfolded part

// A text cut to at most `max` bytes at a UTF-8 boundary, with "..." when cut.
std::string cut_text(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t end = max - 3;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "...";
}

std::string table_rows_text(const Table& t) {
  return std::to_string(t.rows.size()) + (t.rows.size() == 1 ? " row" : " rows");
}

// One block as Markdown; a table becomes a line saying it is in report.html when `tables` is false.
std::string markdown_block(const Block& b, bool image_links, bool tables) {
  std::string o;
  if (b.only == Block::Only::html) return o;
  switch (b.kind) {
    case Block::Kind::heading:
      o += std::string(static_cast<size_t>(b.level), '#') + " " + md_text(b.text) + "\n\n";
      break;
    case Block::Kind::paragraph: o += md_text(b.text) + "\n\n"; break;
    case Block::Kind::bullets:
      for (const auto& i : b.items) o += "- " + md_text(i) + "\n";
      o += "\n";
      break;
    case Block::Kind::table:
      if (tables) o += to_markdown(b.table) + "\n";
      else o += "*A table of " + table_rows_text(b.table) + ", left out here for length: see report.html.*\n\n";
      break;
    case Block::Kind::image:
      if (image_links) o += "![" + md_text(b.text) + "](" + b.image + ")\n\n*" + md_text(b.text) + "*\n\n";
      else o += "*Plot (in report.html; " + md_text(b.image) + " in the run directory): " + md_text(b.text) + "*\n\n";
      break;
  }
  return o;
}

}   // namespace

std::string render_markdown(const Document& d, bool image_links) {
  // Every text is escaped here (md_text), as render_html escapes it: names and messages come from
  // the run directory, and report.md is posted as a pull-request comment.
  const size_t limit = d.markdown_limit;
  const size_t head_limit = limit / 3 * 2;
  std::string head = "# " + md_text(d.title) + "\n\n";
  if (!d.status.empty()) head += "**" + md_text(d.status) + "**\n\n";
  const size_t unfolded_end = std::min(d.fold_from, d.blocks.size());
  for (size_t i = 0; i < unfolded_end; ++i) {
    const Block& b = d.blocks[i];
    if (b.kind != Block::Kind::bullets) {
      head += markdown_block(b, image_links, true);
      continue;
    }
    // A list in the unfolded part (the failures, the key findings) keeps its first items; the
    // count of the rest says that report.html and summary.csv have every one.
    size_t shown = 0;
    for (const auto& item : b.items) {
      const std::string line = "- " + md_text(cut_text(item, kMaxHeadItemBytes)) + "\n";
      if (head.size() + line.size() > head_limit) break;
      head += line;
      ++shown;
    }
    if (shown < b.items.size())
      head += "- ... and " + std::to_string(b.items.size() - shown) +
              " more, left out here for length (report.html and summary.csv list every one)\n";
    head += "\n";
  }

  // The folded sections: each level-2 heading from fold_from on opens one.
  struct Section {
    size_t begin, end;
  };
  std::vector<Section> sections;
  for (size_t i = unfolded_end; i < d.blocks.size(); ++i) {
    const Block& b = d.blocks[i];
    if (b.kind == Block::Kind::heading && b.level == 2) sections.push_back({i, i + 1});
    else if (!sections.empty()) sections.back().end = i + 1;
    else head += markdown_block(b, image_links, true);   // before the first folded heading: not folded
  }
  const auto render_section = [&](const Section& s, bool tables) {
    std::string o;
    // GitHub renders Markdown inside <details> when a blank line follows <summary>; the summary
    // itself is HTML, so the heading is markup-escaped there.
    o += "<details><summary>" + markup_escape(d.blocks[s.begin].text) + "</summary>\n\n";
    for (size_t i = s.begin + 1; i < s.end; ++i) o += markdown_block(d.blocks[i], image_links, tables);
    return o + "</details>\n\n";
  };
  const size_t note_room = 1500;   // for the paragraph naming what was left out
  std::string folds;
  std::vector<std::string> left_out;
  for (const auto& s : sections) {
    const std::string& name = d.blocks[s.begin].text;
    std::string full = render_section(s, true);
    if (head.size() + folds.size() + full.size() + note_room <= limit) {
      folds += full;
      continue;
    }
    std::string tables_out = render_section(s, false);
    std::string what;
    for (size_t i = s.begin; i < s.end; ++i)
      if (d.blocks[i].kind == Block::Kind::table && d.blocks[i].only != Block::Only::html)
        what += (what.empty() ? "" : ", ") + table_rows_text(d.blocks[i].table);
    if (head.size() + folds.size() + tables_out.size() + note_room <= limit) {
      folds += tables_out;
      left_out.push_back("the tables of \"" + name + "\" (" + what + ")");
    } else {
      left_out.push_back("the section \"" + name + "\"");
    }
  }
  std::string note;
  if (!left_out.empty()) {
    std::string list;
    for (size_t i = 0; i < left_out.size(); ++i)
      list += (i == 0 ? "" : i + 1 == left_out.size() ? " and " : ", ") + left_out[i];
    note = md_text(cut_text("Left out of this Markdown to stay under the 65,536 characters GitHub takes in a comment "
                            "or step summary: " +
                                list + ". report.html in the run directory holds every section.",
                            note_room - 4)) +
           "\n\n";
  }
  std::string o = head + note + folds;
  while (!o.empty() && o.back() == '\n' && o.size() >= 2 && o[o.size() - 2] == '\n') o.pop_back();
  return o;
}

std::string render_html(const Document& d, const std::string& run_dir) {
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  markup_escape(d.title) + "</title>\n<style>\n" + kCss + "</style>\n</head>\n<body>\n";
  if (!d.status.empty())
    o += std::string("<div id=\"status\" class=\"status ") + (d.status_ok ? "pass" : "fail") + "\"><strong>" +
         markup_escape(d.status) + "</strong></div>\n";
  o += "<h1>" + markup_escape(d.title) + "</h1>\n";
  for (const auto& b : d.blocks) {
    if (b.only == Block::Only::markdown) continue;
    switch (b.kind) {
      case Block::Kind::heading: {
        const std::string tag = "h" + std::to_string(b.level);
        o += "<" + tag + ">" + markup_escape(b.text) + "</" + tag + ">\n";
        break;
      }
      case Block::Kind::paragraph: o += "<p>" + markup_escape(b.text) + "</p>\n"; break;
      case Block::Kind::bullets:
        o += "<ul>\n";
        for (const auto& i : b.items) o += "<li>" + markup_escape(i) + "</li>\n";
        o += "</ul>\n";
        break;
      case Block::Kind::table:
        // No scrolling wrapper: tables wrap their cells to fit the page (tests/test_report_browser.py
        // checks that none is wider than its container at 1280 px).
        o += to_html(b.table);
        break;
      case Block::Kind::image: {
        const auto path = std::filesystem::path(run_dir) / b.image;
        const std::string png = read_run_file(path.string(), 64ull << 20);   // regular file, capped
        o += "<figure>\n<img alt=\"" + markup_escape(b.text) + "\" src=\"data:image/png;base64," + base64(png) +
             "\">\n<figcaption>" + markup_escape(b.text) + "</figcaption>\n</figure>\n";
        break;
      }
    }
  }
  return o + "</body>\n</html>\n";
}

}   // namespace rh::report
