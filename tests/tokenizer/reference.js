// The GPT-2 references for test_tokenizer, run with node:
//   node reference.js encode ENCODER_DIR DOCS.json OUT   ids of each document (gpt-3-encoder), one line each
//   node reference.js split gpt2|llama3 DOCS.json OUT     UTF-8 byte lengths of the pre-tokenizer's pieces
//   node reference.js bench ENCODER_DIR DOCS.json         seconds to encode all documents (after a warm-up)
// The split patterns are the tokenizers' own, in JavaScript's Unicode regex syntax ((?i:...)
// spelt as character classes: JavaScript has no inline flags).
const fs = require('fs');
const path = require('path');

const patterns = {
  gpt2: /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu,
  llama3: /'(?:[sS\u017F]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu,
};

// gpt-3-encoder's encode() grows its result with Array.concat, quadratic in a document's
// length (a 200 kB source file takes tens of seconds). The document is therefore handed to it
// in pieces of about 2 kB cut only after a newline that stands between two non-space
// characters: there the GPT-2 pattern ends a match (the newline alone) and starts a new one
// whatever follows, so the pieces' ids joined are the whole document's ids.
function chunks(d) {
  const out = [];
  let start = 0;
  const ws = /\s/u;
  for (let i = 2048; i < d.length; i++) {
    if (i - start >= 2048 && d[i - 1] === '\n' && !ws.test(d[i - 2]) && !ws.test(d[i]) &&
        !(d.charCodeAt(i) >= 0xDC00 && d.charCodeAt(i) <= 0xDFFF) && !(d.charCodeAt(i - 2) >= 0xDC00 && d.charCodeAt(i - 2) <= 0xDFFF)) {
      out.push(d.slice(start, i));
      start = i;
    }
  }
  out.push(d.slice(start));
  return out;
}
const encodeDoc = (enc, d) => chunks(d).flatMap(c => enc.encode(c));

const [mode, a, b, c] = process.argv.slice(2);
if (mode === 'split') {
  const docs = JSON.parse(fs.readFileSync(b, 'utf8'));
  const lines = docs.map(d => Array.from(d.matchAll(patterns[a])).map(m => Buffer.byteLength(m[0], 'utf8')).join(' '));
  fs.writeFileSync(c, lines.join('\n') + '\n');
} else {
  const enc = require(path.join(a, 'Encoder.js'));
  const docs = JSON.parse(fs.readFileSync(b, 'utf8'));
  if (mode === 'encode') {
    fs.writeFileSync(c, docs.map(d => encodeDoc(enc, d).join(' ')).join('\n') + '\n');
  } else {
    encodeDoc(enc, docs[0]);
    const t0 = process.hrtime.bigint();
    for (const d of docs) encodeDoc(enc, d);
    console.log(Number(process.hrtime.bigint() - t0) / 1e9);
  }
}
