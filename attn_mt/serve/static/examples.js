"use strict";
// Shared by the page and the API docs: a language's name and a sentence to try, from /api/info's facts.

// sentences the built-in toy corpus (en -> de) knows, and a Multi30k-like one the other way
const EXAMPLES = {en: "the old man sees a small dog.", de: "Ein Hund rennt über die Wiese."};

function languageName(code) {  // "en" -> "English"; the code itself where the browser knows no name
  try {
    return new Intl.DisplayNames(["en"], {type: "language"}).of(code) || code;
  } catch {
    return code;
  }
}

function exampleSentence(info) {  // the server's example where it offers one, else one for the source language
  return info.example || EXAMPLES[info.languages.source] || "";
}
