// Hugging Face's own tokenizer implementation for JavaScript (@huggingface/tokenizers,
// tokenizers.js; scripts/setup.sh unpacks it), run by test_tokenizer_sp with node:
//   node hf_reference.cjs LIB_DIR TOKENIZER_DIR DOCS.json OUT
// encodes each document with TOKENIZER_DIR's tokenizer.json (and tokenizer_config.json), no
// special tokens added, and writes its ids one line per document.
const fs = require('fs');
const path = require('path');
const [lib, dir, docsFile, out] = process.argv.slice(2);
const { Tokenizer } = require(path.join(lib, 'dist', 'tokenizers.cjs'));
const json = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
const cfgFile = path.join(dir, 'tokenizer_config.json');
const cfg = fs.existsSync(cfgFile) ? JSON.parse(fs.readFileSync(cfgFile, 'utf8')) : {};
const tok = new Tokenizer(json, cfg);
const docs = JSON.parse(fs.readFileSync(docsFile, 'utf8'));
fs.writeFileSync(out, docs.map(d => tok.encode(d, { add_special_tokens: false }).ids.join(' ')).join('\n') + '\n');
