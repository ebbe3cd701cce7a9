"""The task factory: validated bug-fix tasks made from real Python projects' sdists (SWE-smith style: AST
mutations, validated in the sandbox, split by repository). Entry points: `gagar tasks synth|repos`
(`synth.cli`), `synth.factory.synthesize(sources, options)`."""
