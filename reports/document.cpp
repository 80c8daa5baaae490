// Markdown and HTML printers of a Document; see document.h.
#include "reports/document.h"

#include "reports/run_data.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

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
table.matrix{font-size:12px}table.matrix th,table.matrix td{padding:3px 5px}
table.matrix td:nth-child(2),table.matrix td:nth-child(3){white-space:nowrap}
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
void Document::table(Table t) {
  Block b;
  b.kind = Block::Kind::table;
  b.table = std::move(t);
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

std::string render_markdown(const Document& d, bool image_links) {
  // Every text is escaped here (md_text), as render_html escapes it: names and messages come from
  // the run directory, and report.md is posted as a pull-request comment.
  std::string o = "# " + md_text(d.title) + "\n\n";
  if (!d.status.empty()) o += "**" + md_text(d.status) + "**\n\n";
  bool open = false;   // inside a <details> fold
  for (size_t i = 0; i < d.blocks.size(); ++i) {
    const Block& b = d.blocks[i];
    if (i >= d.fold_from && b.kind == Block::Kind::heading && b.level == 2) {
      // GitHub renders Markdown inside <details> when a blank line follows <summary>; the summary
      // itself is HTML, so the heading is markup-escaped there.
      if (open) o += "</details>\n\n";
      o += "<details><summary>" + markup_escape(b.text) + "</summary>\n\n";
      open = true;
      continue;
    }
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
        o += to_markdown(b.table);
        o += '\n';
        break;
      case Block::Kind::image:
        if (image_links) o += "![" + md_text(b.text) + "](" + b.image + ")\n\n*" + md_text(b.text) + "*\n\n";
        else o += "*Plot (in report.html; " + md_text(b.image) + " in the run directory): " + md_text(b.text) + "*\n\n";
        break;
    }
  }
  if (open) o += "</details>\n";
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
