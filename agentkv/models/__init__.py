"""Model families written against hal ops, and their registry."""
