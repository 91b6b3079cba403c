import { expect, test } from "bun:test";
import { cookieValue } from "../../src/lib/http";

test.each([
  ["a=1; engine_session=ecs_x; b=2", "ecs_x"],
  ["engine_session=ecs%5Fy", "ecs_y"],
  ["  engine_session =  spaced  ", "spaced"],
  ["other=1", null],
  ["engine_sessionx=1", null],
  ["engine_session=%E0%A4%A", null],
  ["", null],
])("cookieValue(%p) is %p", (header, value) => {
  expect(cookieValue(header, "engine_session")).toBe(value);
});
