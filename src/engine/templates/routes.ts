import { Elysia, t } from "elysia";
import { AppTemplate, AUTHED, errorResponses, TemplateIdParams } from "../../contract/engine";
import type { TemplateCatalog } from "./index";

/** TemplateRouteDeps are what the template routes need: the catalog loaded at start-up. */
export interface TemplateRouteDeps {
  templates: TemplateCatalog;
}

/** templateRoutes serves the built-in app templates a service can be deployed from. */
export function templateRoutes(deps: TemplateRouteDeps) {
  return (
    new Elysia({ name: "app-templates" })
      // The list was validated when loaded and never changes, so its JSON is built once.
      .get("/api/app-templates", () => new Response(deps.templates.listJson(), { headers: { "content-type": "application/json" } }), {
        response: { 200: t.Array(AppTemplate), ...errorResponses(...AUTHED) },
        detail: { tags: ["app-templates"], summary: "List app templates" },
      })
      .get("/api/app-templates/:template_id", ({ params }) => deps.templates.get(params.template_id), {
        params: TemplateIdParams,
        response: { 200: AppTemplate, ...errorResponses(...AUTHED, 404, 422) },
        detail: { tags: ["app-templates"], summary: "Get one app template" },
      })
  );
}
