import { describe, expect, test } from "bun:test";
import { bundledTemplateSources, parseTemplate, TemplateCatalog } from "../../../src/engine/templates";

const valid = {
  id: "demo",
  name: "Demo",
  icon: "🧪",
  category: "model",
  repo_url: "https://github.com/example/demo",
  ref: "v1.0.0",
  subdir: "",
  ai_hint: "A demo.",
  deploy_defaults: { port: 8000, gpus: 1, start: "python -m demo --port $PORT", health: "/health" },
  env_schema: [{ name: "MODEL", required: true, secret: false }],
};

describe("app templates", () => {
  const bundled = new TemplateCatalog(bundledTemplateSources());

  test("every bundled template is valid and there are at least 12", () => {
    expect(bundled.problems).toEqual([]);
    expect(bundled.list().length).toBeGreaterThanOrEqual(12);
  });

  test.each([
    "vllm",
    "ollama",
    "llama-cpp",
    "comfyui",
    "postgres",
    "mariadb",
    "redis",
    "qdrant",
    "mlflow",
    "jupyterlab",
    "open-webui",
    "tgi",
  ])("%s is bundled with a real upstream repo, a ref and a start command", (id) => {
    const template = bundled.get(id);
    expect(template.repo_url).toMatch(/^https:\/\/github\.com\/[\w.-]+\/[\w.-]+$/);
    expect(template.ref.length).toBeGreaterThan(0);
    expect(template.deploy_defaults.start).toContain("$PORT");
    expect(
      template.deploy_defaults.health === "" ||
        template.deploy_defaults.health === "tcp" ||
        template.deploy_defaults.health.startsWith("/"),
    ).toBe(true);
  });

  test("model servers ask for a GPU; databases do not", () => {
    for (const id of ["vllm", "tgi", "sglang"]) expect(bundled.get(id).deploy_defaults.gpus).toBeGreaterThanOrEqual(1);
    for (const id of ["postgres", "mariadb", "redis"]) expect(bundled.get(id).deploy_defaults.gpus).toBe(0);
  });

  test("every template with its own probe sets a start period; model servers allow minutes for their weights", () => {
    for (const template of bundled.list().filter((t) => t.deploy_defaults.health !== "" && !t.deploy_defaults.engine)) {
      expect({ id: template.id, set: template.deploy_defaults.health_start_period_s !== undefined }).toEqual({
        id: template.id,
        set: true,
      });
    }
    for (const id of ["vllm", "tgi", "sglang", "llama-cpp"]) {
      expect(bundled.get(id).deploy_defaults.health_start_period_s).toBeGreaterThanOrEqual(600);
    }
  });

  test("secret variables are marked secret", () => {
    const secrets = bundled.list().flatMap((t) => t.env_schema.filter((e) => /TOKEN|PASSWORD|SECRET|_KEY$/.test(e.name)));
    expect(secrets.length).toBeGreaterThan(0);
    for (const entry of secrets) expect({ name: entry.name, secret: entry.secret }).toEqual({ name: entry.name, secret: true });
  });

  test.each([
    ["not JSON", "{", "not valid JSON"],
    ["missing field", JSON.stringify({ ...valid, ref: undefined }), "ref: Field required"],
    [
      "wrong type",
      JSON.stringify({ ...valid, deploy_defaults: { ...valid.deploy_defaults, port: "80" } }),
      "deploy_defaults.port: Input should be a valid integer",
    ],
    [
      "a start period past a day",
      JSON.stringify({ ...valid, deploy_defaults: { ...valid.deploy_defaults, health_start_period_s: 86401 } }),
      "deploy_defaults.health_start_period_s: Input should be less than or equal to 86400",
    ],
    ["bad id", JSON.stringify({ ...valid, id: "Demo!" }), "id: a name is lowercase letters, digits and dashes"],
    ["extra field", JSON.stringify({ ...valid, extra: 1 }), "extra: Extra inputs are not permitted"],
  ])("a broken file (%s) is reported with its reason and skipped", (_, text, problem) => {
    const catalog = new TemplateCatalog([
      { file: "/x/demo.json", text },
      { file: "/x/ok.json", text: JSON.stringify({ ...valid, id: "ok" }) },
    ]);
    expect(catalog.problems.length).toBe(1);
    expect(catalog.problems[0]?.problem).toContain(problem);
    expect(catalog.list().map((t) => t.id)).toEqual(["ok"]);
  });

  test("the id must match the file name", () => {
    expect(parseTemplate({ file: "/x/other.json", text: JSON.stringify(valid) })).toEqual({
      file: "/x/other.json",
      problem: 'id "demo" does not match the file name other.json',
    });
  });

  test("a later source overrides a bundled template with the same id; unknown ids are template_not_found", () => {
    const catalog = new TemplateCatalog([
      { file: "/a/demo.json", text: JSON.stringify(valid) },
      { file: "/b/demo.json", text: JSON.stringify({ ...valid, name: "Mine" }) },
    ]);
    expect(catalog.get("demo").name).toBe("Mine");
    expect(() => catalog.get("nope")).toThrow(expect.objectContaining({ code: "template_not_found" }));
  });
});
