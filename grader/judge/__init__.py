"""The agentic LLM judge: a model reads all passing candidates in one shared workspace, calls tools, and answers
with a tier per candidate. Entry point: `grader.judge.llm.LLMJudge(backend).grade(group, workspace)`; its parts
are the prompt (`prompt`, `view`), the tools (`tools`), the answer grammar (`grammar`) and the aggregation of
several orderings (`aggregate`)."""
